"""Admins hear about nodes going down and foreign processes; people who are not staff do not."""

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from portal.models import NodeAlert
from portal.services.fleet.nodes import nodes_heartbeat_check
from portal.services.notify.notifications import alert_notify
from tests.factories import UserFactory, make_node, node_seen

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin(db):
    return UserFactory(username="root", email="root@example.org", is_staff=True)


def test_it_tells_admins_a_node_went_down(admin, user, django_capture_on_commit_callbacks):
    node = make_node("gpu-z9", gpus=1)
    node_seen(node, timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert nodes_heartbeat_check(now=timezone.now()) == ["gpu-z9"]
    assert [(m.to, m.subject) for m in mail.outbox] == [
        (["root@example.org"], "Node gpu-z9 is down")
    ]


def test_it_tells_admins_and_the_owner_about_a_foreign_process(
    admin, user, django_capture_on_commit_callbacks
):
    alert = NodeAlert.objects.create(
        node=make_node("gpu-z8", gpus=1), kind="foreign_process", time=timezone.now(), pid=7,
        user="eve", detail="eve runs pid 7 on a device booked by alice", owner=user,
    )  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        alert_notify(alert_id=alert.pk)
    assert sorted(m.to[0] for m in mail.outbox) == ["alice@example.org", "root@example.org"]
