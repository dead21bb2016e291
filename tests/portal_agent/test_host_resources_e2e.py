"""A real agent on a simulated node with cores and memory registers them with the live portal."""

import pytest

from portal.models import Node
from tests.agent_cycles import cycle_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_reports_the_nodes_cores_and_memory_less_the_reserved_to_the_portal(real_agents):
    agent = real_agents(
        "sim-host",
        "2xH100-80GB,cpus=112,mem=2T@nvswitch",
        reserved_cpus=2,
        reserved_memory_mib=8192,
    )
    cycle_until(
        agent, lambda: Node.objects.filter(hostname="sim-host", cpus__isnull=False).exists()
    )
    node = Node.objects.get(hostname="sim-host")
    assert (node.cpus, node.memory_mib) == (110, 2 * 1024 * 1024 - 8192)
