"""With a real Celery worker: a server error is retried with backoff and delivered once; a worker
killed in the middle of a send comes back (acks_late) to find the delivery claimed, so the
receiver never gets a second copy."""

import os
import signal
import subprocess
import time

import pytest
from django.db import transaction
from django.utils import timezone

from portal.models import Delivery, NotificationContact
from portal.services.notify.notifications import booking_event_record
from tests.factories import make_active_booking, make_node
from tests.notifications.conftest import LOOPBACK_RECEIVERS_ENV
from tests.workers import celery_worker
from tests.workers import wait_until as _wait


@pytest.fixture
def worker(settings):
    with celery_worker(settings, NOTIFY_RETRY_BACKOFF_S="1", **LOOPBACK_RECEIVERS_ENV) as process:
        yield process


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_it_sends_no_second_copy_after_a_worker_dies_mid_send(worker, receiver, owner, project):
    receiver.delay_s = 3  # a slow receiver: the send is in flight when the worker dies
    NotificationContact.objects.create(user=owner, webhook_url=f"{receiver.url}/hook")
    booking = make_active_booking(list(make_node("kill-a", gpus=1).gpus.all()), owner=owner,
                                  project=project)  # fmt: skip
    with transaction.atomic():
        booking_event_record(booking_id=booking.pk, event="started", now=timezone.now())
    _wait(lambda: receiver.arrivals, 60, "the worker to start sending")
    (child,) = subprocess.run(
        ["pgrep", "-P", str(worker.pid)], capture_output=True, text=True, check=True
    ).stdout.split()
    os.kill(int(child), signal.SIGKILL)
    # The worker forks a new child and the task comes back to it (reject_on_worker_lost).
    _wait(
        lambda: (
            subprocess.run(["pgrep", "-P", str(worker.pid)], capture_output=True).stdout
            not in (b"", child.encode() + b"\n")
        ),
        60,
        "a new worker child",
    )
    time.sleep(5)
    assert receiver.arrivals == 1
    delivery = Delivery.objects.get(channel="webhook")
    assert delivery.status == "sending" and delivery.attempts == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_it_retries_a_server_error_in_the_worker_and_delivers_once(
    worker, receiver, owner, project, settings
):
    NotificationContact.objects.create(user=owner, webhook_url=f"{receiver.url}/hook")
    receiver.fail_first = 2
    booking = make_active_booking(list(make_node("retry-a", gpus=1).gpus.all()), owner=owner,
                                  project=project)  # fmt: skip
    with transaction.atomic():
        booking_event_record(booking_id=booking.pk, event="started", now=timezone.now())
    delivery = _wait(
        lambda: Delivery.objects.filter(channel="webhook", status="sent").first(),
        90,
        "the delivery to go through after two server errors",
    )
    assert delivery.attempts == 3 and len(receiver.posts) == 1
