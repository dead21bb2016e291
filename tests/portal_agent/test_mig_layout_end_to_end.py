"""A MIG layout change end to end: a real agent (simulated backend, the demo's MIG GPUs) against
the real portal over HTTP; staff ask, the pass plans and starts it, the agent applies it and
registers, the old slices stay in the history."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Gpu, MigInstance, MigLayoutChange, Node
from portal.services.allocation.allocation import allocation_pass
from portal.services.allocation.mig_changes import mig_layout_request
from tests.agent_cycles import cycle_until
from tests.factories import UserFactory, make_active_booking

pytestmark = pytest.mark.django_db(transaction=True)

HOSTNAME = "sim-mig"
# One of the demo's gpu-a03 MIG GPUs (portal.services.reporting.demo).
SPEC = "1xA100-80GB:mig=3g.40gb+2g.20gb+1g.10gb+1g.10gb"


def test_it_plans_and_applies_a_layout_and_keeps_the_old_slices(real_agents, allocation_passes):
    agent = real_agents(HOSTNAME, SPEC)
    node = Node.objects.get(hostname=HOSTNAME)
    cycle_until(agent, lambda: MigInstance.objects.filter(gpu__node=node).count() == 4)
    gpu = Gpu.objects.get(node=node)
    old = list(MigInstance.objects.filter(gpu=gpu).order_by("id"))
    alice = UserFactory(username="alice")
    busy = make_active_booking([old[0]], owner=alice)  # history on the first slice
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    change = mig_layout_request(
        gpu_id=gpu.pk, instances=[{"profile": "3g.40gb"}, {"profile": "3g.40gb"}], by=root
    )

    # Planned for when the booking ends; the agent is told nothing yet.
    allocation_pass(now=timezone.now())
    change.refresh_from_db()
    assert change.state == "planned" and change.planned_at > timezone.now()
    for _ in range(3):
        agent.handle_one_cycle()
    assert agent.desired.mig_layouts == []

    # The booking ends: the pass starts the change, the agent applies it and registers.
    busy.allocations.update(end=timezone.now() + timedelta(milliseconds=200))
    cycle_until(agent, lambda: busy.allocations.first().end < timezone.now())
    allocation_pass(now=timezone.now())
    assert MigLayoutChange.objects.get(pk=change.pk).state == "applying"
    agent._pull_requested = True  # the push, in a test without websockets
    cycle_until(agent, lambda: MigLayoutChange.objects.get(pk=change.pk).state == "done")

    live = MigInstance.objects.filter(gpu=gpu, retired_at__isnull=True).order_by("placement_start")
    assert [(m.profile, m.placement_start) for m in live] == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert {m.uuid for m in live}.isdisjoint(m.uuid for m in old)
    kept = MigInstance.objects.get(pk=old[0].pk)
    assert kept.retired_at is not None  # booked once: retired, with its booking
    assert busy.allocations.filter(mig_instance=kept).exists()
    assert not MigInstance.objects.filter(pk__in=[m.pk for m in old[1:]]).exists()
    assert [m.profile for m in agent.backend.discover()[0].mig_instances] == ["3g.40gb"] * 2
