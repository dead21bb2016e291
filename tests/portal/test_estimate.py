"""POST bookings/estimate/: named as on a booking, throttled per user, one queue copy shared."""

import time

import pytest
from django.utils import timezone

from portal.services.core.counters import counter_value
from tests.conftest import error_of
from tests.factories import UserFactory, member

pytestmark = pytest.mark.django_db

ASAP = {"gpus": 2, "duration_s": 600}


def _estimate(api, body=ASAP):
    return api.post("/api/v1/bookings/estimate/", body, format="json")


def _hog(user, project):
    """All 16 GPUs held for two hours from now."""
    from portal.models import Allocation, Booking, Gpu

    project.quotas.update(max_gpus=None)  # the estimates wait for devices, not for quota
    now = timezone.now()
    booking = Booking.objects.create(
        owner=user,
        project=project,
        gpus=16,
        duration_s=7200,
        state="active",
        submitted_at=now,
        started_at=now,
    )
    Allocation.objects.bulk_create(
        Allocation(
            booking=booking, gpu=gpu, start=now, end=now + timezone.timedelta(hours=2), fraction=1
        )
        for gpu in Gpu.objects.all()
    )


@pytest.mark.both_databases
def test_it_gives_no_queue_position_to_a_request_that_starts_now(api, project, cluster):
    response = _estimate(api)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["pending_reason"] == "starting"
    assert body["queue_position"] is None  # was 1: it never waits in the queue
    started = timezone.datetime.fromisoformat(body["planned_start"])
    assert abs((started - timezone.now()).total_seconds()) < 30
    assert set(body) == {
        "planned_start",
        "queue_position",
        "pending_reason",
        "state_detail",
        "next_window",
    }


def test_it_answers_429_with_retry_after_past_the_per_user_rate(api, project, cluster, settings):
    settings.ESTIMATE_RATE = "2/min"
    assert [_estimate(api).status_code for _ in range(2)] == [200, 200]
    response = _estimate(api)
    assert response.status_code == 429
    assert error_of(response)["code"] == "throttled"
    assert 1 <= int(response["Retry-After"]) <= 60
    other = UserFactory(username="bob")
    member(other, project)
    api.force_authenticate(other)
    assert _estimate(api).status_code == 200  # per user: bob has his own allowance


@pytest.mark.both_databases
def test_it_plans_estimates_within_the_ttl_on_one_copy_of_the_queue(
    api, user, project, cluster, settings
):
    settings.ESTIMATE_SNAPSHOT_TTL_S = 60
    before = counter_value("estimate_snapshots")
    assert _estimate(api).json()["pending_reason"] == "starting"
    _hog(user, project)
    # The same copy: the hog that came since is not in it yet, the request itself is.
    again = _estimate(api, {"gpus": 4, "duration_s": 600}).json()
    assert again["pending_reason"] == "starting"
    assert counter_value("estimate_snapshots") == before + 1
    settings.ESTIMATE_SNAPSHOT_TTL_S = 0.2
    time.sleep(0.3)
    later = _estimate(api).json()
    assert later["pending_reason"] == "resources" and later["queue_position"] == 1
    assert counter_value("estimate_snapshots") == before + 2


@pytest.mark.both_databases
def test_it_reads_the_queue_for_each_estimate_with_a_ttl_of_zero(
    api, user, project, cluster, settings
):
    settings.ESTIMATE_SNAPSHOT_TTL_S = 0
    before = counter_value("estimate_snapshots")
    assert _estimate(api).json()["pending_reason"] == "starting"
    _hog(user, project)
    assert _estimate(api).json()["pending_reason"] == "resources"
    assert counter_value("estimate_snapshots") == before + 2


@pytest.mark.both_databases
def test_it_stops_planning_once_the_estimate_is_placed(
    api, user, project, cluster, settings, monkeypatch
):
    import scheduler
    from portal.models import Booking
    from portal.services.allocation import estimate

    settings.ESTIMATE_SNAPSHOT_TTL_S = 0
    _hog(user, project)
    old = timezone.now() - timezone.timedelta(hours=1)
    Booking.objects.bulk_create(
        Booking(owner=user, project=project, gpus=1, duration_s=600, submitted_at=old)
        for _ in range(5)
    )
    walks, real = [], scheduler.plan

    def plan(state, policy, **kwargs):
        result = real(state, policy, **kwargs)
        walks.append((len(state.pending), len(result.planned), result))
        return result

    monkeypatch.setattr(estimate.scheduler, "plan", plan)
    body = _estimate(api, {"gpus": 1, "duration_s": 600, "qos": "high"}).json()
    assert body["queue_position"] == 1  # ahead of the five older bookings (higher QOS)
    ((pending, walked, _),) = walks
    assert (pending, walked) == (6, 1)  # not the five behind it


def _queue_behind_hog(user, project):
    from portal.models import Booking

    _hog(user, project)
    old = timezone.now() - timezone.timedelta(hours=1)
    Booking.objects.bulk_create(
        Booking(owner=user, project=project, gpus=g, duration_s=600 * (i + 1), submitted_at=old)
        for i, g in enumerate([1, 2, 4, 8, 1, 16, 3])
    )


def _counting_plans(monkeypatch) -> list:
    import scheduler
    from portal.services.allocation import estimate

    plans, real = [], scheduler.plan

    def plan(*args, **kwargs):
        plans.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(estimate.scheduler, "plan", plan)
    return plans


@pytest.mark.both_databases
def test_it_answers_from_the_kept_walk_what_the_whole_plan_answers(
    api, user, project, cluster, settings, monkeypatch
):
    from portal.services.allocation.estimate import estimate_snapshot_forget

    _queue_behind_hog(user, project)
    plans = _counting_plans(monkeypatch)
    settings.ESTIMATE_SNAPSHOT_TTL_S = 60
    asks = [{"gpus": g, "duration_s": d} for g, d in ((2, 1200), (8, 600), (1, 3000))]
    kept = [_estimate(api, ask).json() for ask in asks]
    assert plans == []  # the walk kept with the queue answered, not a plan of the queue
    estimate_snapshot_forget()
    settings.ESTIMATE_SNAPSHOT_TTL_S = 0  # a plan of the queue with the request, each time
    assert [_estimate(api, ask).json() for ask in asks] == kept
    assert len(plans) == 3
    assert {body["pending_reason"] for body in kept} == {"resources"}


def test_it_plans_the_queue_for_a_request_that_would_change_the_walk_before_it(
    api, user, project, cluster, settings, monkeypatch
):
    _queue_behind_hog(user, project)
    plans = _counting_plans(monkeypatch)
    settings.ESTIMATE_SNAPSHOT_TTL_S = 60
    # A higher QOS than the whole queue's moves protection to it: not the kept walk's order.
    body = _estimate(api, {"gpus": 1, "duration_s": 600, "qos": "high"}).json()
    assert body["queue_position"] == 1
    assert [kwargs["until"] for kwargs in plans] == ["0"]


def _refreshed(estimate) -> None:
    deadline = time.monotonic() + 60
    while estimate._refreshing.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_it_answers_from_the_last_queue_while_the_next_is_walked(
    api, user, project, cluster, settings
):
    from portal.services.allocation import estimate

    settings.ESTIMATE_SNAPSHOT_TTL_S = 1.0
    before = counter_value("estimate_snapshots")
    assert _estimate(api).json()["pending_reason"] == "starting"
    _hog(user, project)
    time.sleep(1.1)
    # Past the TTL the last queue (no hog in it) answers at once; the next is read meanwhile.
    assert _estimate(api).json()["pending_reason"] == "starting"
    _refreshed(estimate)
    assert _estimate(api).json()["pending_reason"] == "resources"
    assert counter_value("estimate_snapshots") >= before + 2
    _refreshed(estimate)  # none left reading when the test's tables are emptied


@pytest.mark.django_db(transaction=True)
def test_it_reads_the_queue_again_before_answering_once_it_is_long_past_its_ttl(
    api, user, project, cluster, settings, monkeypatch
):
    from portal.services.allocation import estimate

    monkeypatch.setattr(estimate, "STALE_GRACE_S", 0.0)  # "long past" at once
    settings.ESTIMATE_SNAPSHOT_TTL_S = 0.5
    assert _estimate(api).json()["pending_reason"] == "starting"
    _hog(user, project)
    time.sleep(0.6)
    assert _estimate(api).json()["pending_reason"] == "resources"
    assert not estimate._refreshing.is_set()


@pytest.mark.parametrize("ttl", [0, 5])
def test_it_estimates_a_high_qos_request_that_will_preempt_as_preempting(
    api, user, project, cluster, settings, ttl
):
    from portal.models import Allocation, Booking, Gpu

    settings.ESTIMATE_SNAPSHOT_TTL_S = ttl  # planned afresh, and resumed from the kept walk
    settings.SCHEDULER_POLICY = {**settings.SCHEDULER_POLICY, "preempt_grace_s": 300}
    project.quotas.update(max_gpus=None, allowed_qos=None)
    now = timezone.now()
    batch = Booking.objects.create(
        owner=user, project=project, gpus=16, duration_s=86400, state="active", qos="low",
        preemptible=True, command="python train.py", submitted_at=now, started_at=now,
    )  # fmt: skip
    Allocation.objects.bulk_create(
        Allocation(
            booking=batch, gpu=gpu, start=now, end=now + timezone.timedelta(days=1), fraction=1
        )
        for gpu in Gpu.objects.all()
    )
    # A queue to resume the kept walk in (with none the estimate plans afresh).
    Booking.objects.create(
        owner=user, project=project, gpus=1, duration_s=600, qos="high", submitted_at=now
    )
    body = _estimate(api, {"gpus": 8, "duration_s": 3600, "qos": "high"}).json()
    assert body["pending_reason"] == "preempting", body
    assert body["state_detail"].startswith(f"will preempt booking {batch.pk} at ")
    grace_end = (now + timezone.timedelta(seconds=300)).astimezone(timezone.timezone.utc)
    moments = {
        (grace_end + timezone.timedelta(seconds=s)).strftime("%Y-%m-%d %H:%M") for s in (-30, 30)
    }
    assert any(body["state_detail"].endswith(f" at {m} UTC") for m in moments), body
    # The planned start stays the one its devices are held for (when the victims end): a bound.
    start = timezone.datetime.fromisoformat(body["planned_start"])
    assert abs((start - (now + timezone.timedelta(days=1))).total_seconds()) < 30


def _window(start, hours: float = 1) -> dict:
    end = start + timezone.timedelta(hours=hours)
    return {"gpus": 2, "start": start.isoformat(), "end": end.isoformat()}


@pytest.mark.both_databases
def test_it_offers_the_next_window_of_the_same_length_when_a_window_does_not_fit(
    api, user, project, cluster
):
    from portal.models import Allocation

    _hog(user, project)  # every GPU for two hours
    hog_end = Allocation.objects.order_by("end").last().end
    asked = timezone.now().replace(microsecond=0) + timezone.timedelta(hours=1)
    response = _estimate(api, _window(asked, hours=1.5))
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["pending_reason"], body["planned_start"]) == ("no_capacity", None)
    window = body["next_window"]
    start = timezone.datetime.fromisoformat(window["start"])
    end = timezone.datetime.fromisoformat(window["end"])
    assert abs((start - hog_end).total_seconds()) < 1  # the first moment the devices free up
    assert end - start == timezone.timedelta(hours=1.5)  # the same length
    # The window offered fits: asked for, it is what the estimate says fits.
    again = _estimate(api, {"gpus": 2, "start": window["start"], "end": window["end"]}).json()
    assert (again["pending_reason"], again["next_window"]) == ("fits", None)


def test_it_offers_no_next_window_where_none_fits_within_the_search(api, user, project, cluster):
    from portal.models import Allocation

    _hog(user, project)
    Allocation.objects.update(end=timezone.now() + timezone.timedelta(days=40))  # past the search
    asked = timezone.now() + timezone.timedelta(hours=1)
    body = _estimate(api, _window(asked)).json()
    assert (body["pending_reason"], body["next_window"]) == ("no_capacity", None)
