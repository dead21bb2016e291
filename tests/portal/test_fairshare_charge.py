"""Fair share on measured use (SCHEDULER_FAIRSHARE_CHARGE): what a project's past allocations
cost it in priority when they are charged as allocated, as measured, or as a blend.

The history below: projects "idle" and "busy" each held one GPU for the same eight hours; idle's
ran at 2 % utilization, busy's at 90 %. Project "fresh" held nothing. All three then queue the
same one-GPU request behind a site that is full, so the pass gives each a priority.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Allocation, Booking, SampleMinute
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.snapshot import scheduler_policy
from portal.services.booking import fairshare
from portal.services.booking.bookings import booking_release
from tests.factories import (
    BookingFactory,
    ProjectFactory,
    QuotaFactory,
    UserFactory,
    make_active_booking,
    make_mig_gpu,
    make_node,
    member,
)

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

IDLE_UTIL, BUSY_UTIL = 2.0, 90.0


def _minutes(gpu, first, count, utilization):
    SampleMinute.objects.bulk_create(
        SampleMinute(
            node=gpu.node,
            uuid=gpu.uuid,
            minute=first + timedelta(minutes=i),
            samples=12,
            utilization_gpu_avg=utilization,
        )
        for i in range(count)
    )


def _held_and_ended(project, gpu, utilization, now):
    """A booking of ``project`` that held ``gpu`` from 10 h to 2 h ago at this utilization."""
    owner = UserFactory()
    member(owner, project)
    start = now - timedelta(hours=10)
    booking = make_active_booking([gpu], owner=owner, project=project)
    Allocation.objects.filter(booking=booking).update(start=start, end=now + timedelta(hours=1))
    _minutes(gpu, start, 8 * 60, utilization)
    booking_release(user=owner, booking_id=booking.pk, now=now - timedelta(hours=2))
    return booking


@pytest.fixture
def site(settings):
    """Four GPUs, all held now by a long booking of project "hog"; the history above, which
    ended while the site charged measured use (so it was measured)."""
    settings.SCHEDULER_POLICY = {"fairshare_charge": "measured"}
    now = timezone.now().replace(microsecond=0)
    gpus = list(make_node("node-a", gpus=4).gpus.order_by("index"))
    projects = {slug: ProjectFactory(slug=slug) for slug in ("idle", "busy", "fresh", "hog")}
    for project in projects.values():
        QuotaFactory(project=project, max_gpus=None)
    _held_and_ended(projects["idle"], gpus[0], IDLE_UTIL, now)
    _held_and_ended(projects["busy"], gpus[1], BUSY_UTIL, now)
    hog = make_active_booking(gpus, project=projects["hog"])
    Allocation.objects.filter(booking=hog).update(end=now + timedelta(days=2))
    return now, projects


def _queue_one_each(projects, now):
    """The same one-GPU request from idle, busy and fresh; the pass's fair-share factor of each."""
    waiting = {}
    for slug in ("idle", "busy", "fresh"):
        owner = UserFactory()
        member(owner, projects[slug])
        waiting[slug] = BookingFactory(
            owner=owner, project=projects[slug], submitted_at=now, duration_s=3600
        )
    allocation_pass(now=now)
    return {slug: Booking.objects.get(pk=b.pk).priority["fairshare"] for slug, b in waiting.items()}


def test_it_measures_an_allocations_mean_utilization_when_its_booking_ends(site):
    measured = dict(
        Allocation.objects.filter(booking__project__slug__in=("idle", "busy")).values_list(
            "booking__project__slug", "mean_utilization"
        )
    )
    assert measured == {"idle": pytest.approx(0.02), "busy": pytest.approx(0.90)}


def test_it_measures_nothing_while_fair_share_charges_allocated_time(settings):
    settings.SCHEDULER_POLICY = {}
    gpu = make_node("node-q", gpus=1).gpus.get()
    booking = make_active_booking([gpu])
    _minutes(gpu, timezone.now() - timedelta(minutes=30), 30, BUSY_UTIL)
    booking_release(user=booking.owner, booking_id=booking.pk, now=timezone.now())
    assert Allocation.objects.get(booking=booking).mean_utilization is None


def test_it_charges_idle_and_busy_holders_alike_when_charging_allocated_time(site, settings):
    now, projects = site
    settings.SCHEDULER_POLICY = {"fairshare_charge": "allocated"}
    fair = _queue_one_each(projects, now)
    assert fair["idle"] == fair["busy"] < fair["fresh"]


def test_it_charges_measured_use_with_a_floor_so_an_idle_gpu_still_costs(site, settings):
    now, projects = site
    settings.SCHEDULER_POLICY = {"fairshare_charge": "measured", "fairshare_idle_floor": 0.25}
    usage = fairshare.project_usage(now=now, policy=scheduler_policy())
    # Eight GPU-hours each, decayed alike: charged at the floor (0.25, not 0.02) and at 0.90.
    assert usage["idle"] / usage["busy"] == pytest.approx(0.25 / 0.90)
    fair = _queue_one_each(projects, now)
    # The busy project used the GPU and pays for it; the idle holder pays the floor: it ranks
    # below a project that held nothing, above the one that used its GPU.
    assert fair["busy"] < fair["idle"] < fair["fresh"]


def test_it_blends_allocated_and_measured_charges(site, settings):
    now, projects = site
    settings.SCHEDULER_POLICY = {
        "fairshare_charge": "blend",
        "fairshare_idle_floor": 0.25,
        "fairshare_blend": 0.5,
    }
    usage = fairshare.project_usage(now=now, policy=scheduler_policy())
    assert usage["idle"] / usage["busy"] == pytest.approx((0.5 + 0.5 * 0.25) / (0.5 + 0.5 * 0.9))


def test_it_charges_in_full_what_nobody_measured(settings):
    """A MIG slice (NVML reports no utilization) or a silent node earns no discount."""
    settings.SCHEDULER_POLICY = {"fairshare_charge": "measured"}
    now = timezone.now().replace(microsecond=0)
    node = make_node("node-m", gpus=0)
    slice_ = make_mig_gpu(node, 0).mig_instances.get(profile="3g.40gb")
    project = ProjectFactory(slug="mig")
    booking = make_active_booking([slice_], project=project)
    booking_release(user=booking.owner, booking_id=booking.pk, now=now)
    assert Allocation.objects.get(booking=booking).mean_utilization is None
    settings.SCHEDULER_POLICY = {"fairshare_charge": "measured"}
    measured = fairshare.project_usage(now=now, policy=scheduler_policy())
    settings.SCHEDULER_POLICY = {}
    allocated = fairshare.project_usage(now=now, policy=scheduler_policy())
    assert measured["mig"] == pytest.approx(allocated["mig"]) and measured["mig"] > 0


def test_it_names_the_charge_in_the_priority_breakdown(site, settings, client):
    now, projects = site
    settings.SCHEDULER_POLICY = {"fairshare_charge": "measured"}
    _queue_one_each(projects, now)
    booking = Booking.objects.filter(state=Booking.State.PENDING).select_related("owner").first()
    client.force_login(booking.owner)
    body = client.get(f"/api/v1/bookings/{booking.pk}/").json()
    assert body["priority"]["fairshare_charge"] == "measured"
    page = client.get(f"/bookings/{booking.pk}/").content.decode()
    assert "measured use (allocated × mean utilization, at least 25%)" in page
