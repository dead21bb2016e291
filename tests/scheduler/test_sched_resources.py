"""The one rule for a booking's cores and memory on a node, and the dominant-resource charge."""

import pytest

from scheduler import NodeResources, Policy, billing_equivalents, node_demand

NODE = NodeResources(cpus=64, memory_mib=1024 * 1024, gpus=8)
PER_GPU = Policy(default_cpus_per_gpu=6, default_memory_mib_per_gpu=100_000)


@pytest.mark.parametrize(
    ("cpus", "memory_mib", "equivalents", "policy", "held"),
    [
        (16, 65536, 1.0, Policy(), (16, 65536)),  # asked: taken as asked, per node
        (16, None, 2.0, Policy(), (16, 262144)),  # memory by proportion
        (None, None, 2.0, Policy(), (16, 262144)),  # 2 of 8 GPUs: a quarter of the node
        (None, None, 0.25, Policy(), (2, 32768)),  # a quarter of a shared GPU
        (None, None, 1 / 7, Policy(), (1, 18724)),  # a 1g slice of a 7-slice GPU
        (None, None, 0.01, Policy(), (1, 1310)),  # at least one core
        (None, None, 2.0, PER_GPU, (12, 200_000)),  # the site default per GPU
        (None, None, 0.5, PER_GPU, (3, 50_000)),
        (8, None, 0.5, PER_GPU, (8, 50_000)),
    ],
)
def test_it_gives_what_was_asked_else_the_default_else_the_nodes_share(
    cpus, memory_mib, equivalents, policy, held
):
    assert node_demand(cpus, memory_mib, equivalents, NODE, policy) == held


def test_it_never_hands_out_more_than_the_node_by_proportion():
    whole = sum(node_demand(None, None, 1.0, NODE, Policy())[0] for _ in range(8))
    slices = sum(node_demand(None, None, 1 / 7, NODE, Policy())[0] for _ in range(56))
    assert whole == 64 and slices == 56


@pytest.mark.parametrize(
    ("gpus", "cpus", "memory_mib", "charged"),
    [
        (2.0, 16, 262144, 2.0),  # a quarter of everything: its GPUs
        (1.0, 8, 768 * 1024, 6.0),  # one GPU, three quarters of the memory: 6 of 8 GPUs
        (1.0, 48, 1024, 6.0),  # one GPU, three quarters of the cores
    ],
)
def test_it_charges_the_dominant_share_of_the_site(gpus, cpus, memory_mib, charged):
    assert billing_equivalents(gpus, cpus, memory_mib, NODE) == pytest.approx(charged)


def test_it_charges_the_gpus_alone_where_the_site_knows_no_cores_or_memory():
    assert billing_equivalents(1.0, 500, 10**9, NodeResources(0, 0, 8)) == 1.0
