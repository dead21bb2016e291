"""The demo's borrowed booking is reclaimed: nlp asks for A100s within its quota, and carol's
borrowed run gets its warning signal, stops and goes back to the queue, within the grace."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from portal.models import Allocation, Booking, Node, Notification
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.snapshot import scheduler_policy
from portal.services.booking.bookings import booking_submit
from portal.services.fleet.selectors import agent_desired
from portal.services.reporting.demo import demo_queue_seed
from tests.portal.test_demo_queue import demo  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def _carol(made):
    return Booking.objects.get(pk__in=made, owner__username="carol", gpu_fraction__isnull=True)


def test_it_reclaims_the_borrowed_a100s_for_a_booking_within_its_quota(
    demo,  # noqa: F811
    settings,
    django_capture_on_commit_callbacks,
):
    made = demo_queue_seed()
    carol = _carol(made)
    assert carol.state == "active" and carol.borrowed
    node_id = Allocation.objects.filter(booking=carol, live=True).first().gpu.node_id
    (job,) = [b for b in agent_desired(node_id=node_id).bookings if b.booking_id == carol.pk]
    assert job.warn_signal == "USR1" and job.warn_before_s == 60  # sent at an early stop too

    bob = get_user_model().objects.get(username="bob")
    asked = timezone.now()
    mine = booking_submit(
        user=bob, now=asked, project="nlp", gpus=4, gpu_model="A100-80GB", duration_s=3600
    )
    allocation_pass(now=asked)
    mine.refresh_from_db()  # it waits its grace less the warning (JOB_KILL_WAIT_S) first
    assert mine.pending_reason == "preempting"
    assert mine.state_detail.startswith(f"will preempt booking {carol.pk} at ")
    policy = scheduler_policy()
    due = asked + timedelta(seconds=policy.reclaim_grace_s - policy.reclaim_warning_s)
    with django_capture_on_commit_callbacks(execute=True):
        allocation_pass(now=due)

    carol.refresh_from_db()
    assert carol.state == "pending" and carol.restart_count == 1  # requeued, its age kept
    assert not carol.borrowed
    assert f"reclaimed for project nlp's quota (booking {mine.pk}); requeued" in carol.state_detail
    # The agent no longer holds it: it sends the warning signal, then SIGTERM a kill wait later
    # (tests/agents/test_agent_jobenv.py pins that early stop).
    assert carol.pk not in [b.booking_id for b in agent_desired(node_id=node_id).bookings]
    told = Notification.objects.get(booking=carol, event="preempted")
    assert "reclaimed for project nlp's quota" in told.context["detail"]

    mine.refresh_from_db()  # it started in the pass that stopped carol's run
    assert mine.state == "active" and not mine.borrowed
    # Its start and the warning carol's job gets fit in the grace.
    waited = mine.started_at - asked + timedelta(seconds=policy.reclaim_warning_s)
    assert waited <= timedelta(seconds=policy.reclaim_grace_s)
    assert {a.gpu.node_id for a in Allocation.objects.filter(booking=mine, live=True)} == {node_id}


def test_it_waits_for_its_quota_with_borrowing_off(demo, settings):  # noqa: F811
    settings.QUOTA_BORROWING = False
    carol = _carol(demo_queue_seed())
    assert carol.state == "pending" and carol.pending_reason == "quota"
    assert "vision quota" in carol.state_detail
    assert Node.objects.count() == 3
