"""benchmarks/frontier_plot.py: the points of the frontier plot and the SVG drawn from them."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "frontier_plot.py"
_SPEC = importlib.util.spec_from_file_location("frontier_plot", _PATH)
frontier_plot = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(frontier_plot)


def waits(mean, wait_max):
    return {"mean_wait_s": mean, "max_wait_s": wait_max, "p99_wait_s": 0.0, "utilization": 1.0}


ROWS = [
    {
        "trace": "t",
        "gpus": 8,
        "easy": waits(100, 1000),
        "portal": waits(50, 1000),
        "x": waits(25, 4000),
    },
    {
        "trace": "t",
        "gpus": 9,
        "easy": waits(100, 1000),
        "portal": waits(200, 1000),
        "x": waits(100, 1000),
    },
    {
        "trace": "t",
        "gpus": 10,
        "easy": waits(0, 0),
        "portal": waits(9, 9),
        "x": waits(9, 9),
    },  # left out
    {"trace": "u", "gpus": 8, "easy": waits(10, 10), "portal": waits(10, 10), "x": waits(10, 10)},
]


def test_it_puts_each_policy_at_its_geometric_mean_ratios_to_easy():
    points = frontier_plot.frontier_points(ROWS, "t")
    assert set(points) == {"easy", "portal", "x"}  # FIFO, off the scale, is left out
    assert points["easy"] == pytest.approx((1.0, 1.0))
    assert points["portal"] == pytest.approx((1.0, 1.0))  # 0.5 and 2: geometric mean 1
    assert points["x"] == pytest.approx((0.5, 2.0))


def test_it_draws_one_labelled_point_per_policy():
    drawing = ET.fromstring(frontier_plot.svg(frontier_plot.frontier_points(ROWS, "t"), "t"))
    circles = drawing.findall("{http://www.w3.org/2000/svg}circle")
    assert len(circles) == 3
    labels = [text.text for text in drawing.findall("{http://www.w3.org/2000/svg}text")]
    assert "3 x (0.50, 2.00)" in labels  # numbered in name order, named in the legend
