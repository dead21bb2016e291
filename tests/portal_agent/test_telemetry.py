"""Telemetry history: per-minute rollups, pruning, and the samples_history selector."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.models import Sample, SampleMinute
from portal.services.fleet.selectors import samples_history
from portal.services.fleet.telemetry import samples_prune, samples_rollup, telemetry_maintain
from tests.factories import NodeFactory, SampleFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


def _at(minute: int, second: int = 0) -> datetime:
    return NOW.replace(second=0) + timedelta(minutes=minute, seconds=second)


def test_it_rolls_up_per_device_and_minute_without_double_counting(settings):
    node = NodeFactory()
    for second, util in [(0, 10.0), (20, 30.0), (40, 80.0)]:
        SampleFactory(
            node=node,
            uuid="GPU-1",
            time=_at(-2, second),
            utilization_gpu=util,
            temperature_c=40 + second,
        )
    SampleFactory(
        node=node, uuid="MIG-1", time=_at(-2, 5), utilization_gpu=None, utilization_memory=None
    )
    SampleFactory(node=node, uuid="GPU-1", time=_at(0, 10))  # the current minute: not yet whole

    assert samples_rollup(now=NOW) == 2
    assert samples_rollup(now=NOW) == 2  # again: same rows, recomputed
    gpu = SampleMinute.objects.get(uuid="GPU-1")
    assert gpu.minute == _at(-2) and gpu.samples == 3
    assert gpu.utilization_gpu_avg == pytest.approx(40.0)
    assert gpu.utilization_gpu_max == 80.0
    assert gpu.temperature_c_avg == pytest.approx(60.0) and gpu.temperature_c_max == 80.0
    assert gpu.memory_used_mib_avg == 1024 and gpu.power_w_avg == 200.0
    mig = SampleMinute.objects.get(uuid="MIG-1")
    assert mig.utilization_gpu_avg is None and mig.utilization_gpu_max is None
    assert SampleMinute.objects.count() == 2


def test_it_counts_late_samples_on_the_next_run(settings):
    node = NodeFactory()
    SampleFactory(node=node, uuid="GPU-1", time=_at(-2, 0), utilization_gpu=10.0)
    samples_rollup(now=NOW)
    SampleFactory(node=node, uuid="GPU-1", time=_at(-2, 30), utilization_gpu=30.0)
    samples_rollup(now=NOW + timedelta(minutes=1))
    row = SampleMinute.objects.get(uuid="GPU-1", minute=_at(-2))
    assert row.samples == 2 and row.utilization_gpu_avg == pytest.approx(20.0)


def test_it_prunes_past_retention_and_is_idempotent(settings):
    settings.TELEMETRY_RAW_RETENTION_H = 1
    settings.TELEMETRY_ROLLUP_RETENTION_D = 2
    node = NodeFactory()
    SampleFactory(node=node, uuid="GPU-1", time=NOW - timedelta(minutes=90))
    kept = SampleFactory(node=node, uuid="GPU-1", time=NOW - timedelta(minutes=30))
    SampleMinute.objects.create(node=node, uuid="GPU-1", minute=_at(-3 * 24 * 60), samples=1)
    recent = SampleMinute.objects.create(node=node, uuid="GPU-1", minute=_at(-24 * 60), samples=1)

    assert samples_prune(now=NOW) == (1, 1)
    assert samples_prune(now=NOW) == (0, 0)
    assert list(Sample.objects.all()) == [kept]
    assert SampleMinute.objects.filter(pk=recent.pk).exists()


def test_it_rolls_up_before_pruning_in_the_periodic_job(settings):
    node = NodeFactory()
    SampleFactory(node=node, uuid="GPU-1", time=NOW - timedelta(minutes=5))
    first = telemetry_maintain(now=NOW)
    second = telemetry_maintain(now=NOW)
    assert first["rolled_up"] == second["rolled_up"] == 1
    assert SampleMinute.objects.get().samples == 1


def test_it_prunes_alerts_not_reported_within_retention_in_the_periodic_job(settings):
    from portal.models import NodeAlert

    settings.TELEMETRY_ROLLUP_RETENTION_D = 2
    node = NodeFactory()
    old, recent = NOW - timedelta(days=3), NOW - timedelta(days=1)
    stale = NodeAlert.objects.create(node=node, kind="unbooked_process", time=old, pid=1)
    # First seen long ago, still reported: kept.
    ongoing = NodeAlert.objects.create(
        node=node, kind="unbooked_process", time=old, last_seen=recent, pid=2
    )
    assert telemetry_maintain(now=NOW)["alerts_pruned"] == 1
    assert list(NodeAlert.objects.all()) == [ongoing]
    assert not NodeAlert.objects.filter(pk=stale.pk).exists()


def test_it_returns_raw_history_within_raw_retention():
    node = NodeFactory()
    now = timezone.now()
    for i in range(10):
        SampleFactory(
            node=node,
            uuid="GPU-1",
            time=now - timedelta(seconds=50 - 5 * i),
            utilization_gpu=float(i),
        )
    SampleFactory(node=node, uuid="MIG-1", time=now - timedelta(seconds=5), utilization_gpu=None)
    points = samples_history(uuid="GPU-1", since=now - timedelta(minutes=1), until=now)
    assert len(points) == 10
    assert set(points[0]) == {
        "time",
        "utilization_gpu",
        "utilization_memory",
        "memory_used_mib",
        "memory_total_mib",
        "temperature_c",
        "power_w",
    }
    assert [p["utilization_gpu"] for p in points] == [float(i) for i in range(10)]
    mig = samples_history(uuid="MIG-1", since=now - timedelta(minutes=1), until=now)
    assert mig[0]["utilization_gpu"] is None


def test_it_downsamples_to_at_most_max_points_keeping_nulls_null():
    node = NodeFactory()
    now = timezone.now()
    for i in range(100):
        SampleFactory(
            node=node, uuid="GPU-1", time=now - timedelta(seconds=100 - i), utilization_gpu=float(i)
        )
        SampleFactory(
            node=node, uuid="MIG-1", time=now - timedelta(seconds=100 - i), utilization_gpu=None
        )
    points = samples_history(
        uuid="GPU-1", since=now - timedelta(minutes=5), until=now, max_points=10
    )
    assert len(points) == 10
    assert points[0]["utilization_gpu"] == pytest.approx(4.5)  # mean of 0..9
    assert [p["time"] for p in points] == sorted(p["time"] for p in points)
    mig = samples_history(uuid="MIG-1", since=now - timedelta(minutes=5), until=now, max_points=7)
    assert len(mig) <= 7 and all(p["utilization_gpu"] is None for p in mig)


def test_it_uses_minute_rollups_beyond_raw_retention(settings):
    settings.TELEMETRY_RAW_RETENTION_H = 1
    node = NodeFactory()
    now = timezone.now().replace(second=0, microsecond=0)
    for m in range(1, 4):
        SampleMinute.objects.create(
            node=node,
            uuid="GPU-1",
            minute=now - timedelta(hours=2, minutes=m),
            samples=12,
            utilization_gpu_avg=float(m),
            memory_used_mib_avg=100.0,
            memory_total_mib=81920,
        )
    SampleFactory(node=node, uuid="GPU-1", time=now - timedelta(hours=2, minutes=2))  # ignored
    points = samples_history(uuid="GPU-1", since=now - timedelta(hours=3), until=now)
    assert [p["utilization_gpu"] for p in points] == [3.0, 2.0, 1.0]
    assert points[0]["memory_total_mib"] == 81920 and points[0]["power_w"] is None
