"""Two tenants of one shared GPU, a real agent (simulated backend) and the real portal over HTTP:
the one that keeps more GPU memory than its share fails with the reason, and its owner is told;
its neighbour runs on, and each tenant's processes are filed under its own booking."""

import getpass

import pytest
from django.core import mail

from portal.models import Booking, Gpu, Node, ProcessUsage
from tests.agent_cycles import cycle_until
from tests.factories import UserFactory, make_shared_booking

pytestmark = pytest.mark.django_db(transaction=True)

HOSTNAME = "sim-shared"


def _uses(mib: int) -> str:
    return f"export GPU_PORTAL_SIM_MEMORY_MIB={mib}; exec sleep 120"


def test_it_fails_the_tenant_over_its_memory_share_and_its_neighbour_runs_on(
    real_agents, allocation_passes, settings
):
    agent = real_agents(HOSTNAME, "1xH200-141GB", memory_grace_s=0.5)
    node = Node.objects.get(hostname=HOSTNAME)
    cycle_until(agent, lambda: Gpu.objects.filter(node=node).exists())
    gpu = Gpu.objects.get(node=node)
    alice = UserFactory(username="alice", email="alice@example.org")
    over = make_shared_booking(gpu, share=0.5, memory_mib=40960, owner=alice, command=_uses(61440))
    under = make_shared_booking(gpu, share=0.5, memory_mib=40960, owner=alice, command=_uses(10240))

    cycle_until(agent, lambda: Booking.objects.get(pk=over.pk).state == "failed", timeout_s=30)
    # Its stop reaches the portal with the job's last output.
    cycle_until(agent, lambda: "gpu-portal: stopping" in Booking.objects.get(pk=over.pk).log_tail)

    over.refresh_from_db()
    assert over.state_detail.startswith("stopped by the agent: it used ")
    assert "GiB of GPU memory, over its 40 GiB share, for " in over.state_detail
    assert over.state_detail.endswith(f"(node {HOSTNAME})")
    assert any(m.subject == f"Booking {over.pk} failed: {over.state_detail}" for m in mail.outbox)
    for _ in range(5):
        agent.handle_one_cycle()
    assert Booking.objects.get(pk=under.pk).state == "active"
    assert under.pk in agent.dispatcher.jobs
    # Who is on the GPU, per tenant: the agent named each process's booking.
    filed = set(ProcessUsage.objects.filter(device_uuid=gpu.uuid).values_list("booking_id", "user"))
    assert {(over.pk, getpass.getuser()), (under.pk, getpass.getuser())} <= filed
