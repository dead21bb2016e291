"""Fair share by the dominant resource (DRF): an allocation is charged the largest of its GPU,
core and memory shares of the site, in GPU-equivalents, where its node reports cores and memory.

The history: on an 8-GPU node with 64 cores and 1024 GiB, project "wide" held 1 GPU with 768 GiB
(3/4 of the site's memory: 6 GPU-equivalents) and project "two" held 2 GPUs with their share of
cores and memory (2 GPU-equivalents), both for the same eight hours, ended two hours ago.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Allocation, Booking, Node
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.snapshot import scheduler_policy
from portal.services.booking import fairshare
from portal.services.booking.bookings import booking_release
from tests import factories as f

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

GIB = 1024


def _held_and_ended(project, gpus, now, **asked):
    owner = f.UserFactory()
    f.member(owner, project)
    booking = f.make_active_booking(gpus, owner=owner, project=project, **asked)
    Allocation.objects.filter(booking=booking).update(
        start=now - timedelta(hours=10), end=now + timedelta(hours=1)
    )
    booking_release(user=owner, booking_id=booking.pk, now=now - timedelta(hours=2))


@pytest.fixture
def site():
    """The history above; project "hog" holds all eight GPUs now, so the others queue."""
    now = timezone.now().replace(microsecond=0)
    node = f.make_node("node-a", gpus=8)
    Node.objects.filter(pk=node.pk).update(cpus=64, memory_mib=1024 * GIB)
    gpus = list(node.gpus.order_by("index"))
    projects = {slug: f.ProjectFactory(slug=slug) for slug in ("wide", "two", "hog")}
    for project in projects.values():
        f.QuotaFactory(project=project, max_gpus=None)
    _held_and_ended(projects["wide"], gpus[:1], now, memory_mib=768 * GIB)
    _held_and_ended(projects["two"], gpus[1:3], now)
    hog = f.make_active_booking(gpus, project=projects["hog"])
    Allocation.objects.filter(booking=hog).update(end=now + timedelta(days=2))
    return now, projects, node


def _usage(now):
    return fairshare.project_usage(now=now, policy=scheduler_policy())


def test_it_charges_the_dominant_share_and_ranks_a_memory_hog_behind_two_gpus(site):
    now, projects, _ = site
    usage = _usage(now)
    assert usage["wide"] / usage["two"] == pytest.approx(6 / 2)
    waiting = {}
    for slug in ("wide", "two"):
        owner = f.UserFactory()
        f.member(owner, projects[slug])
        waiting[slug] = f.BookingFactory(
            owner=owner, project=projects[slug], submitted_at=now, duration_s=3600
        )
    allocation_pass(now=now)
    fair = {s: Booking.objects.get(pk=b.pk).priority["fairshare"] for s, b in waiting.items()}
    assert fair["wide"] < fair["two"]
    # The running totals the pass folded agree with the history, dominant charge and all.
    later = now + timedelta(minutes=30)
    allocation_pass(now=later)
    assert _usage(later) == pytest.approx(
        fairshare._usage_from_history(now=later, policy=scheduler_policy()), rel=1e-6
    )


def test_it_charges_gpu_equivalents_alone_where_no_node_reports_cores_and_memory(site):
    now, _, node = site
    Node.objects.filter(pk=node.pk).update(cpus=None, memory_mib=None)
    usage = _usage(now)
    assert usage["wide"] / usage["two"] == pytest.approx(1 / 2)
