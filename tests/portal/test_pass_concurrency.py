"""The allocation pass beside people: no lock held while it plans, starts checked against what
changed meanwhile, only changed plans written, passes coalesced, one requeue rule."""

import json
from datetime import timedelta
from types import SimpleNamespace

import psycopg
import pytest
from celery.signals import task_prerun
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import scheduler
from portal.models import Allocation, Booking, Node
from portal.services.allocation import allocation
from portal.services.allocation.snapshot import scheduler_policy, snapshot_take
from portal.services.booking.bookings import booking_submit
from portal.services.fleet.nodes import nodes_heartbeat_check
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    UserFactory,
    make_node,
    member,
    node_seen,
)

pytestmark = pytest.mark.django_db


def _queue(user, project, count: int, **fields) -> list[Booking]:
    fields = {"gpus": 1, "duration_s": 3600, **fields}
    return [
        BookingFactory(owner=user, project=project, state=Booking.State.PENDING, **fields)
        for _ in range(count)
    ]


@pytest.mark.django_db(transaction=True)
def test_it_plans_without_holding_any_node_lock(monkeypatch):
    from tests.factories import ProjectFactory, QuotaFactory

    user, project = UserFactory(username="planner"), ProjectFactory(slug="locks")
    member(user, project)
    QuotaFactory(project=project, max_gpus=None)
    make_node("node-a")
    _queue(user, project, 3)
    seen = []
    real_plan = scheduler.plan

    def plan_while_someone_locks_every_node(state, policy):
        # Another session (a reservation, an extend) takes every node row without waiting.
        with psycopg.connect(_dsn()) as other:
            try:
                other.execute("SELECT id FROM portal_node FOR UPDATE NOWAIT").fetchall()
                seen.append("locked")
            except psycopg.errors.LockNotAvailable:
                seen.append("blocked")
        return real_plan(state, policy)

    monkeypatch.setattr(scheduler, "plan", plan_while_someone_locks_every_node)
    result = allocation.allocation_pass(now=timezone.now())
    assert seen == ["locked"]
    assert result.started == 3


def _dsn() -> str:
    db = connection.settings_dict
    return f"host={db['HOST']} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"


def test_it_skips_a_start_whose_devices_were_taken_after_the_snapshot(user, project):
    make_node("node-a", gpus=1)
    (waiting,) = _queue(user, project, 1)
    now = timezone.now()
    snap = snapshot_take(now=now)
    plan = scheduler.plan(snap.state, scheduler_policy())
    assert [s.booking_id for s in plan.starts] == [str(waiting.pk)]
    # Meanwhile a reservation takes the one GPU (the pass held no lock while planning).
    gpu_id = snap.devices[plan.starts[0].device_ids[0]].gpu_id
    AllocationFactory(gpu_id=gpu_id, start=now - timedelta(minutes=1), end=now + timedelta(hours=2))

    assert allocation._apply_starts(plan, snap, now) == (0, 1)
    waiting.refresh_from_db()
    assert waiting.state == Booking.State.PENDING
    assert Allocation.objects.filter(booking=waiting).count() == 0


def test_it_skips_a_start_whose_node_went_down_after_the_snapshot(user, project):
    node = make_node("node-a", gpus=1)
    (waiting,) = _queue(user, project, 1)
    now = timezone.now()
    snap = snapshot_take(now=now)
    plan = scheduler.plan(snap.state, scheduler_policy())
    Node.objects.filter(pk=node.pk).update(state=Node.State.DOWN)

    assert allocation._apply_starts(plan, snap, now) == (0, 1)
    assert Booking.objects.get(pk=waiting.pk).state == Booking.State.PENDING


def test_it_skips_a_start_when_its_project_got_devices_after_the_snapshot(user, project):
    # The snapshot judged the project's quota without the newer allocation.
    make_node("node-a", gpus=2)
    (waiting,) = _queue(user, project, 1)
    now = timezone.now()
    snap = snapshot_take(now=now)
    plan = scheduler.plan(snap.state, scheduler_policy())
    taken = {snap.devices[d].gpu_id for d in plan.starts[0].device_ids}
    other_gpu = next(g for g in project_gpus() if g not in taken)
    reservation = BookingFactory(owner=user, project=project, state=Booking.State.ACTIVE)
    AllocationFactory(
        booking=reservation, gpu_id=other_gpu, start=now, end=now + timedelta(hours=1)
    )

    assert allocation._apply_starts(plan, snap, now) == (0, 1)
    assert allocation.allocation_pass(now=now).started == 1  # the next pass starts it


def project_gpus() -> list[int]:
    from portal.models import Gpu

    return list(Gpu.objects.values_list("pk", flat=True))


def test_it_writes_only_the_pending_bookings_whose_plan_changed(user, project):
    project.quotas.update(max_gpus=None)
    make_node("node-a", gpus=2)
    now = timezone.now()
    _queue(user, project, 1, gpus=2, duration_s=7200)
    assert allocation.allocation_pass(now=now).started == 1  # it holds the node
    queued = _queue(user, project, 5)
    first = allocation.allocation_pass(now=now + timedelta(seconds=1))
    assert first.started == 0 and first.stored == 5
    assert {b.queue_position for b in Booking.objects.filter(pk__in=[b.pk for b in queued])} == {
        1,
        2,
        3,
        4,
        5,
    }

    with CaptureQueriesContext(connection) as queries:
        again = allocation.allocation_pass(now=now + timedelta(seconds=3))
    assert again.stored == 0
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]

    Booking.objects.filter(pk=queued[0].pk).update(state=Booking.State.CANCELLED)
    moved = allocation.allocation_pass(now=now + timedelta(seconds=5))
    assert moved.stored == 4  # everyone behind the cancelled booking moved up one place


def test_it_compares_stored_priorities_without_decoding_them(user, project, monkeypatch):
    make_node("node-a", gpus=1)
    now = timezone.now()
    _queue(user, project, 1, duration_s=7200)
    assert allocation.allocation_pass(now=now).started == 1  # it holds the node
    _queue(user, project, 2)
    assert allocation.allocation_pass(now=now).stored == 2
    # The pass reads each stored priority as PostgreSQL prints it; an unchanged one matches
    # that text as is, so no JSON is decoded for it.
    # (The pass's own json only: the snapshot reads JSON columns through Django, the GPUs'
    # NVLink peers among them.)
    monkeypatch.setattr(allocation, "json", SimpleNamespace(dumps=json.dumps, loads=None))
    again = allocation.allocation_pass(now=now)
    assert again.pending == 2 and again.stored == 0


def test_it_coalesces_a_burst_of_submissions_into_a_few_passes(
    user, project, settings, django_capture_on_commit_callbacks
):
    settings.SCHEDULER_PASS_COALESCE_S = 60.0
    project.quotas.update(max_gpus=None)
    make_node("node-a")
    passes = []

    def count(sender=None, **kwargs):
        if sender is not None and sender.name == "portal.tasks.allocation_pass":
            passes.append(1)

    task_prerun.connect(count)
    try:
        now = timezone.now()
        for _ in range(500):
            with django_capture_on_commit_callbacks(execute=True):
                booking_submit(user=user, now=now, gpus=1, duration_s=600)
    finally:
        task_prerun.disconnect(count)
    assert 1 <= len(passes) <= 3


def _running(user, project, node, now, **fields) -> Booking:
    fields = {
        "gpus": 2,
        "qos": "low",
        "preemptible": True,
        "command": "python train.py",
        "submitted_at": now - timedelta(hours=2),
        **fields,
    }
    booking = BookingFactory(
        owner=user,
        project=project,
        state=Booking.State.ACTIVE,
        started_at=now - timedelta(hours=1),
        **fields,
    )
    for gpu in node.gpus.all():
        AllocationFactory(
            booking=booking, gpu=gpu, start=now - timedelta(hours=1), end=now + timedelta(hours=5)
        )
    return booking


def _assert_requeued(booking: Booking, now) -> None:
    booking.refresh_from_db()
    assert booking.state == Booking.State.PENDING
    assert booking.started_at is None and booking.ended_at is None
    assert booking.submitted_at == now - timedelta(hours=2)  # keeps its age in the queue
    assert booking.state_detail.endswith("; requeued")
    assert not booking.allocations.filter(live=True).exists()


@pytest.fixture
def preempting(user, project, settings):
    project.quotas.update(max_gpus=None, allowed_qos=None)
    settings.SCHEDULER_POLICY = {**settings.SCHEDULER_POLICY, "preempt_grace_s": 0}


def test_it_requeues_a_preempted_batch_job_as_new_with_its_age(user, project, preempting):
    node, now = make_node("node-a", gpus=2), timezone.now()
    batch = _running(user, project, node, now)
    _queue(user, project, 1, gpus=2, qos="high", submitted_at=now - timedelta(minutes=1))
    assert allocation.allocation_pass(now=now).preempted == 1
    _assert_requeued(batch, now)


def test_it_requeues_a_batch_job_of_a_failed_node_the_same_way(user, project):
    node, now = make_node("node-a", gpus=2), timezone.now()
    batch = _running(user, project, node, now)
    node_seen(node, now - timedelta(hours=1))
    assert nodes_heartbeat_check(now=now) == ["node-a"]
    _assert_requeued(batch, now)


def test_it_never_requeues_a_preempted_reservation(user, project, preempting):
    node, now = make_node("node-a", gpus=2), timezone.now()
    window = {"start": now - timedelta(hours=1), "end": now + timedelta(hours=5)}
    reservation = _running(user, project, node, now, duration_s=6 * 3600, **window)
    _queue(user, project, 1, gpus=2, qos="high", submitted_at=now - timedelta(minutes=1))
    assert allocation.allocation_pass(now=now).preempted == 1
    reservation.refresh_from_db()
    assert reservation.state == Booking.State.PREEMPTED


@pytest.mark.django_db(transaction=True)
def test_it_runs_no_pass_inside_a_pass_when_its_own_changes_ask_for_one(monkeypatch):
    from tests.factories import ProjectFactory

    # Each finished booking commits on its own and asks for a pass; tasks run eagerly here.
    user, project = UserFactory(username="nested"), ProjectFactory(slug="nested")
    node, now = make_node("node-a", gpus=2), timezone.now()
    for gpu in node.gpus.all():
        ended = BookingFactory(owner=user, project=project, state=Booking.State.ACTIVE)
        AllocationFactory(booking=ended, gpu=gpu, start=now - timedelta(hours=2), end=now)
    snapshots = []
    real = allocation.snapshot_take

    def counting(**kwargs):
        snapshots.append(kwargs["now"])
        return real(**kwargs)

    monkeypatch.setattr(allocation, "snapshot_take", counting)
    result = allocation.allocation_pass(now=now)
    assert result.finished == 2
    assert snapshots == [now]


def test_it_skips_a_start_whose_booking_was_extended_after_the_snapshot(user, project):
    make_node("node-a", gpus=1)
    (waiting,) = _queue(user, project, 1)
    now = timezone.now()
    snap = snapshot_take(now=now)
    plan = scheduler.plan(snap.state, scheduler_policy())
    Booking.objects.filter(pk=waiting.pk).update(duration_s=waiting.duration_s + 600)

    assert allocation._apply_starts(plan, snap, now) == (0, 1)
    started = allocation.allocation_pass(now=now)  # the next pass plans its new length
    allocation_ = Allocation.objects.get(booking=waiting)
    assert started.started == 1
    assert (allocation_.end - allocation_.start).total_seconds() == waiting.duration_s + 600
