"""Fair-share use kept as running totals: each pass decays them and adds the use since the last,
instead of decaying four half-lives of allocations; the answer is the same as from the history."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Allocation, FairshareUsage
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.snapshot import scheduler_policy
from portal.services.booking import fairshare
from portal.services.booking.bookings import booking_release
from tests.factories import ProjectFactory, QuotaFactory, make_active_booking, make_node

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]


@pytest.fixture
def history():
    """Project "past" held a GPU from 3 days to 1 day ago; "now" holds one since 2 h ago."""
    now = timezone.now().replace(microsecond=0)
    gpus = list(make_node("node-a", gpus=2).gpus.order_by("index"))
    past, current = ProjectFactory(slug="past"), ProjectFactory(slug="now")
    for project in (past, current):
        QuotaFactory(project=project, max_gpus=None)
    ended = make_active_booking([gpus[0]], project=past)
    Allocation.objects.filter(booking=ended).update(
        start=now - timedelta(days=3), end=now + timedelta(days=1)
    )
    booking_release(user=ended.owner, booking_id=ended.pk, now=now - timedelta(days=1))
    running = make_active_booking([gpus[1]], project=current)
    Allocation.objects.filter(booking=running).update(
        start=now - timedelta(hours=2), end=now + timedelta(days=1)
    )
    return now, ended, running


def _from_history(now):
    return fairshare._usage_from_history(now=now, policy=scheduler_policy())


def test_it_keeps_the_totals_equal_to_the_history_pass_after_pass(history):
    now, _, running = history
    for minutes in (0, 7, 60, 61, 600):
        at = now + timedelta(minutes=minutes)
        allocation_pass(now=at)
        kept = fairshare.project_usage(now=at, policy=scheduler_policy())
        assert kept == pytest.approx(_from_history(at), rel=1e-6)
    # Between passes (an estimate's snapshot): the totals plus the use not yet folded in.
    later = now + timedelta(minutes=700)
    assert fairshare.project_usage(now=later, policy=scheduler_policy()) == pytest.approx(
        _from_history(later), rel=1e-6
    )
    assert FairshareUsage.objects.count() == 2  # one per user in a project
    booking_release(user=running.owner, booking_id=running.pk, now=later)
    allocation_pass(now=later + timedelta(minutes=5))
    assert fairshare.project_usage(
        now=later + timedelta(minutes=5), policy=scheduler_policy()
    ) == pytest.approx(_from_history(later + timedelta(minutes=5)), rel=1e-6)


def test_it_reads_an_ended_allocation_once_not_every_pass(history):
    now, ended, _ = history
    allocation_pass(now=now)
    before = fairshare.project_usage(now=now, policy=scheduler_policy())
    # Were the history read again, ten times the GPUs would show ten times the use.
    Allocation.objects.filter(booking=ended).update(fraction=10.0)
    allocation_pass(now=now + timedelta(seconds=1))
    after = fairshare.project_usage(now=now + timedelta(seconds=1), policy=scheduler_policy())
    assert after["past"] == pytest.approx(before["past"], rel=1e-4)
    assert not fairshare._charging(now + timedelta(seconds=1)).filter(booking=ended).exists()


def test_it_builds_the_totals_again_under_another_half_life(history, settings):
    now, _, _ = history
    allocation_pass(now=now)
    settings.SCHEDULER_POLICY = {"fairshare_half_life_s": 86400.0}
    policy = scheduler_policy()
    assert fairshare.project_usage(now=now, policy=policy) == pytest.approx(
        _from_history(now), rel=1e-6
    )
    allocation_pass(now=now + timedelta(minutes=1))
    assert set(FairshareUsage.objects.values_list("half_life_s", flat=True)) == {86400.0}
    assert fairshare.project_usage(now=now + timedelta(minutes=1), policy=policy) == (
        pytest.approx(_from_history(now + timedelta(minutes=1)), rel=1e-6)
    )
