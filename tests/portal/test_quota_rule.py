"""One quota rule on every path: the allocator, reservations, extend, admission, the estimate and
the budget scan read a request's quota position the same way and judge it the same way."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.errors import QuotaExceeded
from portal.models import Booking, Notification, Quota
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.estimate import _request_fields, booking_estimate
from portal.services.booking.booking_rules import check_request
from portal.services.booking.bookings import booking_extend, booking_submit
from portal.services.notify.notify_scan import notifications_scan
from scheduler.quota import GPU_SECOND
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    QuotaFactory,
    UserFactory,
    make_mig_gpu,
    make_node,
    member,
)

# The rule decides queued passes and estimates too: it runs on SQLite (the default mode) as well.
pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


def _used(owner, project, gpu, hours: float, now) -> None:
    """`hours` GPU-hours already used in the budget period by a finished booking."""
    done = BookingFactory(owner=owner, project=project, state=Booking.State.FINISHED)
    start = now - timedelta(hours=hours + 1)
    AllocationFactory(
        booking=done, gpu=gpu, start=start, end=start + timedelta(hours=hours), live=False
    )


# The three divergences of issue 22, each a test that failed before the one rule.


def test_it_refuses_a_reservation_that_would_put_the_project_over_its_concurrent_limit(
    project, user, cluster
):
    project.quotas.update(max_gpus=4)
    bob = UserFactory(username="bob")
    member(bob, project)
    now = timezone.now()
    start, end = now + timedelta(hours=1), now + timedelta(hours=2)
    booking_submit(user=user, now=now, project="vision", gpus=4, start=start, end=end)
    with pytest.raises(QuotaExceeded) as refused:
        booking_submit(user=bob, now=now, project="vision", gpus=4, start=start, end=end)
    assert refused.value.extra["limit"] == "max_gpus"
    assert refused.value.extra["usage"] == 4
    assert "gpus" in refused.value.fields
    assert Booking.objects.filter(owner=bob).count() == 0


def test_it_counts_the_gpu_hours_already_used_when_extending(project, user, cluster):
    project.quotas.update(gpu_hours_budget=10)
    now = timezone.now()
    _used(user, project, cluster[0].gpus.first(), 9, now)
    start = now + timedelta(hours=1)
    booking = booking_submit(
        user=user, now=now, gpus=1, start=start, end=start + timedelta(hours=1)
    )  # 9 + 1 = 10 of 10: fits
    with pytest.raises(QuotaExceeded) as refused:
        booking_extend(user=user, booking_id=booking.pk, now=now, by_s=5 * 3600)
    assert refused.value.extra["limit"] == "gpu_hours_budget"
    assert refused.value.extra["usage"] == pytest.approx(9)
    assert "by_s" in refused.value.fields
    assert Booking.objects.get(pk=booking.pk).duration_s == 3600


def test_it_counts_a_pending_mig_booking_by_its_slice_when_extending(project, user, db):
    project.quotas.update(gpu_hours_budget=1)
    make_mig_gpu(make_node("mig-node", gpus=0), 0)
    now = timezone.now()
    # 3/7 of a GPU for 2 h: 0.86 GPU-hours, queued (no pass runs here).
    booking = booking_submit(user=user, now=now, mig_profile="3g.40gb", duration_s=7200)
    assert booking.state == Booking.State.PENDING
    with pytest.raises(QuotaExceeded) as refused:
        booking_extend(user=user, booking_id=booking.pk, now=now, by_s=3600)
    assert refused.value.extra["limit"] == "gpu_hours_budget"
    assert Booking.objects.get(pk=booking.pk).duration_s == 7200


# The table: path x limit x boundary. A position is what is held or used already (by the user,
# or for a project limit by another member) plus what the request asks; every path must admit
# it just under and exactly at the limit and refuse it just over.

TOTAL = {
    "max_gpus": {"under": 3, "at": 4, "over": 5},
    "budget": {"under": 9.5, "at": 10, "over": 10.5},
}
LIMIT = {"max_gpus": 4, "budget": 10}
HELD_GPUS = 2  # held over the request's window, where the path has one
USED_HOURS = 6  # GPU-hours used in the budget period
MIG_FRACTION = 3 / 7  # a 3g.40gb slice
LIMITS = ("user max_gpus", "project max_gpus", "user budget", "project budget")
BOUNDARIES = ("under", "at", "over")


class Site:
    """The project "vision" with alice (who asks) and bob (another member), two 8-GPU nodes."""

    def __init__(self, project, alice, cluster, limit: str, value: float):
        self.project, self.alice, self.now = project, alice, timezone.now()
        self.bob = UserFactory(username="bob")
        member(self.bob, project)
        self.scope, self.kind = limit.split()
        self.holder = alice if self.scope == "user" else self.bob
        self.free = [g for node in cluster for g in node.gpus.order_by("index")]
        field = "max_gpus" if self.kind == "max_gpus" else "gpu_hours_budget"
        project_row = Quota.objects.filter(project=project, user__isnull=True)
        project_row.update(max_gpus=None, gpu_hours_budget=None)
        if self.scope == "user":
            QuotaFactory(project=project, user=alice, **{field: value})
        else:
            project_row.update(**{field: value})
            QuotaFactory(project=project, user=alice, **{field: 1000})

    def gpus(self, n: int) -> list:
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def hold(self, gpus: int, *, owner=None, start=None, end=None) -> Booking:
        """A live booking of `gpus` whole GPUs (the holder's unless `owner`)."""
        start = start or self.now - timedelta(minutes=1)
        end = end or self.now + timedelta(hours=3)
        booking = BookingFactory(
            owner=owner or self.holder,
            project=self.project,
            gpus=gpus,
            state=Booking.State.ACTIVE,
            started_at=start,
            submitted_at=start,
            duration_s=int((end - start).total_seconds()),
        )
        for gpu in self.gpus(gpus):
            AllocationFactory(booking=booking, gpu=gpu, start=start, end=end)
        return booking

    def use(self, hours: float) -> None:
        _used(self.holder, self.project, self.free[-1], hours, self.now)

    def asks(self, total: float) -> float:
        """What the request asks for a position of `total` (held or used, plus asked)."""
        if self.kind == "max_gpus":
            self.hold(HELD_GPUS)
            return total - HELD_GPUS
        self.use(USED_HOURS)
        return total - USED_HOURS


def _queued_pass(site: Site, total: float) -> bool:
    ask = site.asks(total)
    gpus, hours = (ask, 1) if site.kind == "max_gpus" else (1, ask)
    booking = booking_submit(
        user=site.alice, now=site.now, gpus=int(gpus), duration_s=round(hours * 3600)
    )
    allocation_pass(now=site.now)
    booking.refresh_from_db()
    if booking.state == Booking.State.PENDING:
        assert booking.pending_reason == "quota", booking.state_detail
        return True
    return False


def _reservation(site: Site, total: float) -> bool:
    ask = site.asks(total)
    gpus, hours = (ask, 1) if site.kind == "max_gpus" else (1, ask)
    start = site.now + timedelta(minutes=10)
    end = start + timedelta(seconds=round(hours * 3600))
    return _refused(
        booking_submit, user=site.alice, now=site.now, gpus=int(gpus), start=start, end=end
    )


def _extend_active(site: Site, total: float) -> bool:
    ask = site.asks(total)
    gpus, hours = (ask, 1) if site.kind == "max_gpus" else (1, ask)
    mine = site.hold(int(gpus), owner=site.alice, start=site.now, end=site.now + timedelta(hours=1))
    # Over the added half hour (max_gpus), or to `hours` GPU-hours from now (budget).
    by_s = 1800 if site.kind == "max_gpus" else round((hours - 1) * 3600)
    return _refused(booking_extend, user=site.alice, booking_id=mine.pk, now=site.now, by_s=by_s)


def _extend_pending(site: Site, total: float, *, mig: bool = False) -> bool:
    # A queued booking holds no window yet: its width counts alone against max_gpus.
    if site.kind == "max_gpus":
        gpus, duration_s, by_s = total, 3600, 60
    else:
        site.use(USED_HOURS)
        width = MIG_FRACTION if mig else 1
        gpus, duration_s, by_s = 1, round((total - USED_HOURS) / width * 3600) - 60, 60
    what = {"gpus": 0, "mig_profile": "3g.40gb"} if mig else {"gpus": int(gpus)}
    pending = BookingFactory(
        owner=site.alice, project=site.project, duration_s=duration_s, submitted_at=site.now, **what
    )
    return _refused(booking_extend, user=site.alice, booking_id=pending.pk, now=site.now, by_s=by_s)


def _extend_pending_mig(site: Site, total: float) -> bool:
    if site.kind == "max_gpus":
        # The slice is the whole ask: move the limit around it (4/7, 3/7, 2/7 of a GPU).
        limit = MIG_FRACTION * LIMIT["max_gpus"] / total
        rows = Quota.objects.filter(project=site.project)
        rows.filter(max_gpus__lt=1000).exclude(max_gpus=None).update(max_gpus=limit)
    return _extend_pending(site, total, mig=True)


def _admission(site: Site, total: float) -> bool:
    # Could it ever run? Limits only: the whole position is the ask.
    gpus, hours = (total, 1) if site.kind == "max_gpus" else (1, total)
    fields = _request_fields({"gpus": int(gpus), "duration_s": round(hours * 3600)})
    return _refused(check_request, user=site.alice, now=site.now, **fields)


def _estimate(site: Site, total: float) -> bool:
    ask = site.asks(total)
    gpus, hours = (ask, 1) if site.kind == "max_gpus" else (1, ask)
    estimate = booking_estimate(
        user=site.alice, now=site.now, gpus=int(gpus), duration_s=round(hours * 3600)
    )
    assert estimate.pending_reason in ("starting", "quota"), estimate
    return estimate.pending_reason == "quota"


def _budget_scan(site: Site, total: float) -> bool:
    # The scan asks whether one more GPU-second would pass the budget.
    _used(site.holder, site.project, site.free[-1], total - GPU_SECOND, site.now)
    live = BookingFactory(owner=site.alice, project=site.project, submitted_at=site.now)
    notifications_scan(now=site.now)
    return Notification.objects.filter(booking=live, event="budget").exists()


def _refused(call, **kwargs) -> bool:
    try:
        call(**kwargs)
    except QuotaExceeded as exc:
        assert exc.extra["limit"] in ("max_gpus", "gpu_hours_budget"), exc.extra
        assert {"limit_value", "usage", "asks"} <= set(exc.extra), exc.extra
        assert exc.fields, exc.message
        return True
    return False


PATHS = {
    "queued pass": _queued_pass,
    "reservation": _reservation,
    "extend active": _extend_active,
    "extend pending": _extend_pending,
    "extend pending MIG": _extend_pending_mig,
    "admission": _admission,
    "estimate": _estimate,
    "budget scan": _budget_scan,
}
CELLS = [
    (path, limit, boundary)
    for path in PATHS
    for limit in LIMITS
    for boundary in BOUNDARIES
    if not (path == "budget scan" and limit.endswith("max_gpus"))
]


@pytest.mark.parametrize(("path", "limit", "boundary"), CELLS)
def test_it_gives_the_same_answer_on_every_path_for_the_same_position(
    path, limit, boundary, project, user, cluster, settings
):
    settings.NOTIFY_BUDGET_FRACTION = 1.0
    kind = limit.split()[1]
    site = Site(project, user, cluster, limit, LIMIT[kind])
    refused = PATHS[path](site, TOTAL[kind][boundary])
    assert refused == (boundary == "over"), f"{path}, {limit}, {boundary}"


def test_it_admits_slices_that_fill_the_limit_exactly(project, user, db):
    """Sevenths add up to the limit itself: 3/7 held and 4/7 asked is 1 GPU of 1."""
    project.quotas.update(max_gpus=1)
    gpu = make_mig_gpu(make_node("mig-node", gpus=0), 0, profiles=("3g.40gb", "4g.40gb"))
    now = timezone.now()
    start, end = now + timedelta(hours=1), now + timedelta(hours=2)
    held = gpu.mig_instances.get(profile="3g.40gb")
    booking = BookingFactory(
        owner=user, project=project, gpus=0, mig_profile="3g.40gb", state=Booking.State.PLANNED
    )
    AllocationFactory(
        booking=booking, gpu=gpu, mig_instance=held, start=start, end=end, fraction=3 / 7
    )
    more = booking_submit(user=user, now=now, mig_profile="4g.40gb", start=start, end=end)
    assert more.state == Booking.State.PLANNED


def test_it_names_the_projects_limit_when_only_the_project_has_one(project, user, cluster):
    """Only the project's limit was set: the waiting booking names the project, not the user
    (who has the project's limit as theirs, and alone fills it)."""
    project.quotas.update(max_gpus=2, gpu_hours_budget=None)
    now = timezone.now()
    for _ in range(2):
        booking_submit(user=user, now=now, gpus=1, duration_s=3600)
    waiting = booking_submit(user=user, now=now, gpus=1, duration_s=3600)
    allocation_pass(now=now)
    waiting.refresh_from_db()
    assert (waiting.state, waiting.pending_reason) == (Booking.State.PENDING, "quota")
    assert waiting.state_detail == f"project {project.slug} quota: 2 of 2 GPUs in use, needs 1"
