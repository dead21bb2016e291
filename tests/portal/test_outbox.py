"""The outbox: a booking command's transaction holds only its own rows and one fact; the fact's
subscribers (notify, live, agents, pass request) run after commit, the sweep sends what a dead
process left, and nothing is sent for a change that rolled back."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.models import Delivery, DomainEvent, IdleReclaim, Notification
from portal.services.booking import events
from portal.services.booking.bookings import booking_cancel, booking_release, booking_submit
from portal.services.core import outbox
from portal.services.core.outbox import outbox_sweep
from portal.services.notify.notifications import booking_fact_notify
from portal.services.notify.reclaim import booking_reclaim
from tests.channel_listen import listen_as_owner
from tests.factories import make_active_booking, make_node, node_seen

pytestmark = pytest.mark.django_db

# Recipients (preferences, contacts, project settings) and what is recorded for them.
NOTIFY_TABLES = (
    "portal_notification",
    "portal_delivery",
    "portal_notificationpreference",
    "portal_notificationcontact",
    "portal_projectnotificationsettings",
)


def _notify_sql(queries) -> list[str]:
    return [q["sql"] for q in queries if any(t in q["sql"] for t in NOTIFY_TABLES)]


def _reserve(user, project, now):
    start = now + timedelta(days=1)
    return booking_submit(
        user=user,
        now=now,
        project=project.slug,
        gpus=1,
        start=start,
        end=start + timedelta(hours=1),
    )


def _later():
    return timezone.now() + timedelta(seconds=outbox.SWEEP_GRACE_S + 1)


@pytest.mark.both_databases
def test_it_keeps_notification_work_out_of_the_booking_transaction(
    user, project, cluster, django_capture_on_commit_callbacks
):
    now = timezone.now()
    with django_capture_on_commit_callbacks() as callbacks:
        with CaptureQueriesContext(connection) as command:
            booking = _reserve(user, project, now)
    assert _notify_sql(command.captured_queries) == []
    (fact,) = DomainEvent.objects.all()
    assert (fact.kind, fact.booking_id, fact.payload) == (
        "booking_changed",
        booking.pk,
        {"event": "submitted", "cause": "owner"},
    )
    with CaptureQueriesContext(connection) as after:
        for callback in callbacks:
            callback()
    assert _notify_sql(after.captured_queries)  # recipients read, rows written: after commit
    assert Notification.objects.get(booking=booking).event == "queued"
    assert DomainEvent.objects.get().dispatched_at is not None

    with django_capture_on_commit_callbacks() as callbacks:
        with CaptureQueriesContext(connection) as command:
            booking_cancel(user=user, booking_id=booking.pk, now=now)
    assert _notify_sql(command.captured_queries) == []
    assert not Notification.objects.filter(booking=booking, event="ended").exists()
    for callback in callbacks:
        callback()
    assert Notification.objects.filter(booking=booking, event="ended").count() == 1


@pytest.mark.both_databases
def test_it_sends_nothing_for_a_change_that_rolled_back(
    user, project, cluster, django_capture_on_commit_callbacks
):
    booking = make_active_booking([cluster[0].gpus.first()], owner=user, project=project)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            events.booking_changed(booking, "released", cause="owner")
            raise RuntimeError("the command failed after recording its fact")
    assert callbacks == []
    assert not DomainEvent.objects.exists()
    assert outbox_sweep(now=_later()) == 0
    assert not Notification.objects.exists() and not Delivery.objects.exists()


def test_it_broadcasts_after_commit_and_never_for_a_rollback(
    user, project, cluster, django_capture_on_commit_callbacks
):
    booking = make_active_booking([cluster[0].gpus.first()], owner=user, project=project)
    receive = listen_as_owner(user.pk)
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            booking_cancel(user=user, booking_id=booking.pk, now=timezone.now())
            raise RuntimeError("rolled back")
    with django_capture_on_commit_callbacks(execute=True):
        booking_release(user=user, booking_id=booking.pk, now=timezone.now())
    message = receive()  # the first one: the rolled-back cancel sent nothing before it
    assert (message["type"], message["event"], message["state"]) == (
        "booking.changed",
        "released",
        "finished",
    )


@pytest.mark.both_databases
def test_it_sweeps_a_fact_whose_dispatch_never_ran_exactly_once(user, project, cluster):
    # No on-commit callback runs here: as if the process died right after the commit.
    booking = _reserve(user, project, timezone.now())
    assert not Notification.objects.exists()
    assert outbox_sweep(now=timezone.now()) == 0  # young: its own dispatch may still come
    assert outbox_sweep(now=_later()) == 1
    assert Notification.objects.filter(booking=booking, event="queued").count() == 1
    deliveries = Delivery.objects.count()
    assert deliveries >= 1
    assert outbox_sweep(now=_later()) == 0
    assert outbox.facts_dispatch(fact_ids=[DomainEvent.objects.get().pk]) == 0
    assert Notification.objects.count() == 1 and Delivery.objects.count() == deliveries


@pytest.fixture
def flaky():
    """A subscriber that fails on its first call, as a broker or Redis outage would."""
    calls = []

    def flaky_subscriber(fact):
        calls.append(fact.pk)
        if len(calls) == 1:
            raise OSError("redis unreachable")

    outbox.subscribe(events.BOOKING_CHANGED, flaky_subscriber)
    yield calls
    outbox.unsubscribe(events.BOOKING_CHANGED, flaky_subscriber)


@pytest.mark.both_databases
def test_it_retries_a_failed_subscriber_without_sending_the_others_twice(
    user, project, cluster, flaky
):
    booking = _reserve(user, project, timezone.now())
    first_try = _later()
    assert outbox_sweep(now=first_try) == 0
    fact = DomainEvent.objects.get()
    assert fact.dispatched_at is None and fact.attempts == 1
    assert "redis unreachable" in fact.last_error
    assert "portal.services.notify.notifications.booking_fact_notify" in fact.done
    assert Notification.objects.filter(booking=booking).count() == 1
    deliveries = Delivery.objects.count()
    assert outbox_sweep(now=first_try + timedelta(seconds=outbox.RETRY_BASE_S - 1)) == 0  # waits
    assert outbox_sweep(now=first_try + timedelta(seconds=outbox.RETRY_BASE_S + 1)) == 1
    assert flaky == [fact.pk, fact.pk]
    assert Notification.objects.filter(booking=booking).count() == 1
    assert Delivery.objects.count() == deliveries
    assert DomainEvent.objects.get().dispatched_at is not None


RACE_KIND = "test.race"


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_fact_claimed_by_another_dispatcher_once():
    # Dispatcher A has claimed the fact and is inside its subscriber when dispatcher B (another
    # connection: the after-commit dispatch of another process) asks for the same fact.
    inside, finish, calls, errors = threading.Event(), threading.Event(), [], []

    def slow_subscriber(fact):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            inside.set()
            assert finish.wait(30)

    fact = DomainEvent.objects.create(kind=RACE_KIND, created_at=timezone.now())
    outbox.subscribe(RACE_KIND, slow_subscriber)

    def dispatcher_a():
        try:
            outbox.facts_dispatch(fact_ids=[fact.pk])
        except Exception as exc:  # pragma: no cover - shown by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=dispatcher_a, name="A")
    try:
        thread.start()
        assert inside.wait(30)
        assert outbox.facts_dispatch(fact_ids=[fact.pk]) == 0  # B: A holds the claim
        finish.set()
        thread.join(30)
    finally:
        finish.set()
        outbox.unsubscribe(RACE_KIND, slow_subscriber)
    assert not errors and calls == ["A"]
    fact.refresh_from_db()
    assert fact.dispatched_at is not None and fact.attempts == 1


def test_it_tells_a_reclaim_as_a_reclaim_without_asking_reclaim(user, project, cluster):
    booking = make_active_booking([cluster[0].gpus.first()], owner=user, project=project)
    now = timezone.now()
    IdleReclaim.objects.create(booking=booking, warned_at=now - timedelta(minutes=6))
    assert booking_reclaim(booking_id=booking.pk, now=now)
    (fact,) = DomainEvent.objects.all()
    assert fact.payload == {"event": "released", "cause": "reclaim"}
    with CaptureQueriesContext(connection) as notify:
        booking_fact_notify(fact)
    assert not [q for q in notify.captured_queries if IdleReclaim._meta.db_table in q["sql"]]
    assert Notification.objects.get(booking=booking).event == "reclaimed"


@pytest.mark.both_databases
def test_it_records_who_caused_a_release(user, project, cluster):
    owners = make_active_booking([cluster[0].gpus.first()], owner=user, project=project)
    linked = make_active_booking([cluster[1].gpus.first()], owner=user, project=project)
    booking_release(user=user, booking_id=owners.pk, now=timezone.now())
    with events.caused_by("link"):
        booking_release(user=user, booking_id=linked.pk, now=timezone.now())
    causes = dict(DomainEvent.objects.values_list("booking_id", "payload__cause"))
    assert causes == {owners.pk: "owner", linked.pk: "link"}


def test_it_records_a_node_down_as_a_fact_and_tells_admins_after_commit(
    django_capture_on_commit_callbacks,
):
    from django.contrib.auth import get_user_model

    from portal.services.fleet.nodes import nodes_heartbeat_check

    get_user_model().objects.create(username="root", email="root@example.org", is_staff=True)
    node = make_node("gpu-down", gpus=1)
    node_seen(node, timezone.now() - timedelta(hours=1))
    with django_capture_on_commit_callbacks() as callbacks:
        assert nodes_heartbeat_check(now=timezone.now()) == ["gpu-down"]
    assert not Notification.objects.exists()
    (fact,) = DomainEvent.objects.filter(kind="node_down")
    assert fact.node_id == node.pk and fact.payload["hostname"] == "gpu-down"
    for callback in callbacks:
        callback()
    assert Notification.objects.get().event == "node_down"


@pytest.mark.both_databases
def test_it_forgets_dispatched_facts_after_a_week_and_keeps_undispatched_ones(
    user, project, cluster
):
    _reserve(user, project, timezone.now())
    _reserve(user, project, timezone.now() + timedelta(hours=2))
    first, second = DomainEvent.objects.order_by("id")
    assert outbox.facts_dispatch(fact_ids=[first.pk]) == 1
    week_later = timezone.now() + timedelta(days=outbox.KEEP_DAYS, minutes=1)
    DomainEvent.objects.filter(pk=second.pk).update(claimed_until=week_later)  # held elsewhere
    outbox_sweep(now=week_later)
    assert list(DomainEvent.objects.values_list("pk", flat=True)) == [second.pk]


@pytest.fixture
def broken():
    """A subscriber that always fails, as a bug in it would."""
    calls = []

    def broken_subscriber(fact):
        calls.append(fact.pk)
        raise ValueError("a bug in the subscriber")

    outbox.subscribe(events.BOOKING_CHANGED, broken_subscriber)
    yield calls
    outbox.unsubscribe(events.BOOKING_CHANGED, broken_subscriber)


@pytest.mark.both_databases
def test_it_backs_off_a_failing_fact_and_gives_up_after_max_attempts(
    user, project, cluster, broken
):
    _reserve(user, project, timezone.now())
    at = _later()
    waits = []
    for attempt in range(1, outbox.MAX_ATTEMPTS + 3):
        outbox_sweep(now=at)
        fact = DomainEvent.objects.get()
        assert fact.dispatched_at is None
        if attempt <= outbox.MAX_ATTEMPTS:
            assert fact.attempts == attempt and len(broken) == attempt
            waits.append((fact.claimed_until - at).total_seconds())
        else:  # given up: the sweep no longer runs it, its last error stays for an admin
            assert fact.attempts == outbox.MAX_ATTEMPTS and len(broken) == outbox.MAX_ATTEMPTS
            assert "a bug in the subscriber" in fact.last_error
        at = max(at, fact.claimed_until) + timedelta(seconds=1)
    assert waits[:3] == [outbox.RETRY_BASE_S, 2 * outbox.RETRY_BASE_S, 4 * outbox.RETRY_BASE_S]
    assert max(waits) == outbox.RETRY_MAX_S


@pytest.mark.both_databases
def test_it_records_node_changes_as_facts_that_ask_for_a_pass(
    django_capture_on_commit_callbacks, monkeypatch
):
    from django.contrib.auth import get_user_model

    from portal.models import Node
    from portal.services.fleet.nodes import node_drain, node_return_to_service

    asked = []
    monkeypatch.setattr(events, "request_allocation_pass", lambda: asked.append(1))
    admin = get_user_model().objects.create(username="root", is_staff=True, is_superuser=True)
    node = make_node("gpu-drain", gpus=1)
    with django_capture_on_commit_callbacks() as callbacks:
        assert node_drain(node_ids=[node.pk], actor=admin) == 1
    assert asked == []  # nothing asked inside the command
    (fact,) = DomainEvent.objects.filter(kind=events.NODE_CHANGED)
    assert (fact.node_id, fact.payload["change"]) == (node.pk, "drain")
    for callback in callbacks:
        callback()
    assert asked == [1]
    with django_capture_on_commit_callbacks(execute=True):
        assert node_return_to_service(node_ids=[node.pk], actor=admin) == 1
    assert asked == [1, 1]
    assert Node.objects.get(pk=node.pk).state == Node.State.UP
    changes = DomainEvent.objects.filter(kind=events.NODE_CHANGED).order_by("id")
    assert [f.payload["change"] for f in changes] == ["drain", "return"]


@pytest.mark.parametrize(
    ("staff_cell", "superuser_cell", "told"),
    [
        ("all", "all", {"staff", "root"}),
        ("no", "all", {"root"}),
        ("all", "no", {"staff"}),
    ],
)
def test_it_tells_site_events_to_whom_the_roles_table_grants_them(
    monkeypatch, staff_cell, superuser_cell, told
):
    from django.contrib.auth import get_user_model

    from portal.services.access import permissions
    from portal.services.fleet.nodes import nodes_heartbeat_check

    label, cells = permissions.CAN["notify.site_events"]
    cells = {**cells, "staff": staff_cell, "superuser": superuser_cell}
    monkeypatch.setitem(permissions.CAN, "notify.site_events", (label, cells))
    users = get_user_model().objects
    users.create(username="staff", email="staff@example.org", is_staff=True)
    users.create(username="root", email="root@example.org", is_superuser=True)
    users.create(username="member", email="member@example.org")
    node = make_node("gpu-silent", gpus=1)
    node_seen(node, timezone.now() - timedelta(hours=1))
    nodes_heartbeat_check(now=timezone.now())
    outbox.facts_dispatch(fact_ids=DomainEvent.objects.values_list("pk", flat=True))
    mailed = set(
        Delivery.objects.filter(notification__event="node_down", channel="email").values_list(
            "recipient", flat=True
        )
    )
    assert mailed == {f"{name}@example.org" for name in told}


def test_it_shows_failed_facts_to_admins_in_the_admin(client, user, project, cluster, broken):
    from django.contrib.auth import get_user_model

    _reserve(user, project, timezone.now())
    outbox_sweep(now=_later())
    root = get_user_model().objects.create(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    page = client.get("/admin/portal/domainevent/?dispatch=failed")
    assert page.status_code == 200
    assert b"booking_changed" in page.content and b"1 domain event" in page.content
    assert client.get("/admin/portal/domainevent/add/").status_code == 403
