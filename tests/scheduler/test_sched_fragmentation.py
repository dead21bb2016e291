"""scheduler/fragmentation.py: the FGD paper's stranded-capacity measure on hand-made nodes."""

from __future__ import annotations

import pytest

from scheduler.fragmentation import (
    fragmentation,
    node_fragment,
    node_fragmentation,
    typical_workload,
)

# (each GPU's free fraction, task GPUs, task fraction, the fragment the task leaves)
FRAGMENTS = [
    ((1.0, 1.0), 1, 0.5, 0.0),  # idle node: nothing stranded
    ((0.3, 1.0), 1, 0.5, 0.3),  # the 0.3 left on a GPU is too small for half a GPU
    ((0.3, 1.0), 1, 0.25, 0.0),  # ... but a quarter fits in it
    ((0.3, 0.2), 1, 0.5, 0.5),  # the task fits nowhere: all the free capacity is stranded
    ((0.5, 0.5), 1, 0.5, 0.0),  # exactly enough on both
    ((0.3, 1.0), 1, 1.0, 0.3),  # a whole-GPU task cannot use a partly used GPU
    ((1.0, 1.0, 1.0, 0.4), 4, 1.0, 3.4),  # 4 GPUs wanted, 3 idle: the node is no use to it
    ((1.0, 1.0, 1.0, 1.0), 4, 1.0, 0.0),
    ((0.0, 0.0), 1, 0.5, 0.0),  # a full node has nothing to strand
]


@pytest.mark.parametrize(("free", "gpus", "fraction", "expected"), FRAGMENTS)
def test_it_counts_the_free_capacity_a_task_cannot_use(free, gpus, fraction, expected):
    assert node_fragment(free, gpus, fraction) == pytest.approx(expected)


def test_it_weighs_a_node_by_the_popularity_of_each_task_shape():
    workload = (((1, 0.5), 0.75), ((1, 1.0), 0.25))
    # For half-GPU tasks 0.3 is stranded; for whole-GPU tasks 0.3 + 0.6 (neither GPU is idle).
    assert node_fragmentation((0.3, 0.6), workload) == pytest.approx(0.75 * 0.3 + 0.25 * 0.9)


def test_it_sums_the_nodes_of_a_cluster():
    workload = (((1, 0.5), 1.0),)
    nodes = [(0.3, 1.0), (0.2, 0.2), (1.0, 1.0)]
    assert fragmentation(nodes, workload) == pytest.approx(0.3 + 0.4 + 0.0)


def test_it_takes_the_typical_workload_as_the_share_of_each_shape():
    shapes = [(1, 0.5), (1, 0.5), (1, 1.0), (8, 1.0)]
    assert typical_workload(shapes) == (((1, 0.5), 0.5), ((1, 1.0), 0.25), ((8, 1.0), 0.25))


def test_it_refuses_an_empty_typical_workload():
    with pytest.raises(ValueError, match="at least one task"):
        typical_workload([])
