"""scheduler/packing.py and benchmarks/bench_packing.py: the pod trace loader's bounds, the
first-fit baseline and the packing replay on tiny hand-made traces."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from scheduler.packing import (
    AllocatorPlacer,
    FirstFit,
    Placed,
    Pod,
    TraceError,
    cluster,
    load_pods,
)
from scheduler.packing_replay import PackingReplay, pool_workloads

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_packing.py"
_SPEC = importlib.util.spec_from_file_location("bench_packing", _PATH)
bench_packing = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench_packing)

HEADER = "job_id,user,submit_time_s,duration_s,num_gpus,gpu_fraction"


def write(tmp_path, rows, header=HEADER):
    path = tmp_path / "pods.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return str(path)


def test_it_loads_pods_sorted_by_arrival(tmp_path):
    path = write(tmp_path, ["b,,20,100,1,0.5", "a,,10,50,2,1.000", "c,,30,5,1,"])
    pods = load_pods(path)
    assert [(p.pod_id, p.submit, p.gpus, p.fraction) for p in pods] == [
        ("a", 10.0, 2, 1.0),
        ("b", 20.0, 1, 0.5),
        ("c", 30.0, 1, 1.0),  # no fraction: the whole GPU
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("a,,10,50,0,1", "num_gpus must be in \\[1, 64\\]"),
        ("a,,10,50,65,1", "num_gpus must be in \\[1, 64\\]"),
        ("a,,10,50,2,0.5", "a gpu_fraction below 1 needs num_gpus 1"),
        ("a,,10,50,1,0", "gpu_fraction must be in \\(0, 1\\]"),
        ("a,,10,50,1,1.5", "gpu_fraction must be in \\(0, 1\\]"),
        ("a,,10,50,1,nan", "gpu_fraction must be in \\(0, 1\\]"),
        ("a,,10,-5,1,1", "duration_s must be a whole number"),
        ("a,,1e3,5,1,1", "submit_time_s must be a whole number"),
        ("a,,10,5,١,1", "num_gpus must be a whole number"),  # an Arabic-Indic digit
    ],
)
def test_it_refuses_a_row_out_of_bounds_naming_its_line_and_column(tmp_path, row, message):
    path = write(tmp_path, ["ok,,0,5,1,1", row])
    with pytest.raises(TraceError, match=f"line 3: {message}"):
        load_pods(path)


def test_it_refuses_more_rows_than_its_bound_before_building_them(tmp_path):
    path = write(tmp_path, [f"p{i},,{i},5,1,1" for i in range(4)])
    with pytest.raises(TraceError, match="more than 3 rows"):
        load_pods(path, max_pods=3)
    assert len(load_pods(path, max_pods=4)) == 4


def test_it_refuses_a_trace_without_its_columns(tmp_path):
    path = write(tmp_path, ["a,10,50"], header="job_id,submit_time_s,duration_s")
    with pytest.raises(TraceError, match="missing column\\(s\\) num_gpus"):
        load_pods(path)


def test_it_splits_the_pods_in_halves_by_arrival(tmp_path):
    path = write(tmp_path, [f"p{i},,{t},5,1,1" for i, t in enumerate([0, 1, 2, 1000, 1001])])
    assert [p.pod_id for p in load_pods(path, half="first")] == ["p0", "p1"]
    assert [p.pod_id for p in load_pods(path, half="second")] == ["p2", "p3", "p4"]


def alive(*entries):
    return {
        pod_id: Placed(Pod(pod_id, 0.0, 100.0, len(ids), share), ids, 0.0, share)
        for pod_id, ids, share in entries
    }


def test_it_places_first_fit_on_the_first_gpu_with_room():
    # n000 shared (g0, g1), n001 and n002 exclusive
    devices = cluster(3, 2, shared_nodes=1)
    placer = FirstFit(devices)
    now = alive(("x", ("n000-g0",), 0.75), ("w", ("n001-g0",), 1.0))
    pending = [
        Pod("half", 1, 10, 1, 0.5),  # 0.25 left on g0: the first with room is g1
        Pod("quarter", 2, 10, 1, 0.25),  # fits the 0.25 left on g0
        Pod("two", 3, 10, 2, 1.0),  # n001 has one idle GPU left: n002
        Pod("tenth", 4, 10, 1, 0.1),  # g1 has 0.5 left
        Pod("one", 4, 10, 1, 1.0),  # whole GPUs never go to a shared GPU
        Pod("more", 5, 10, 1, 1.0),  # nothing idle left
    ]
    assert placer.place(5.0, now, pending) == {
        "half": ("n000-g1",),
        "quarter": ("n000-g0",),
        "two": ("n002-g0", "n002-g1"),
        "tenth": ("n000-g1",),
        "one": ("n001-g1",),
    }


def test_it_gives_whole_gpus_to_fractions_without_shared_gpus():
    devices = cluster(1, 2)
    placer = FirstFit(devices)
    pending = [Pod("a", 0, 10, 1, 0.25), Pod("b", 0, 10, 1, 0.25), Pod("c", 0, 10, 1, 0.25)]
    assert placer.place(0.0, {}, pending) == {"a": ("n000-g0",), "b": ("n000-g1",)}


PODS = [
    Pod("a", 0, 100, 1, 0.5),
    Pod("b", 0, 50, 1, 0.5),
    Pod("c", 10, 100, 1, 1.0),
    Pod("d", 20, 10, 2, 1.0),  # waits until both exclusive GPUs are idle
    Pod("e", 30, 60, 1, 0.75),  # 0.5 left on the first shared GPU: the second
]


def test_it_replays_arrivals_and_departures_with_time_weighted_figures():
    devices = cluster(2, 2, shared_nodes=1)
    placer = FirstFit(devices)
    result = PackingReplay(PODS, devices, placer, pool_workloads(PODS, True)).run()
    # a+b share n000-g0 over [0, 50), e holds n000-g1 over [30, 90), c holds n001-g0 over
    # [10, 110); d can only start once both exclusive GPUs are idle, at 110, and ends at 120.
    assert (result.peak_gpus_in_use, result.peak_shared_gpus_in_use) == (3, 2)
    assert (result.waited, result.max_wait_s, result.span_s) == (1, 90.0, 120.0)
    in_use = 1 * 10 + 2 * 20 + 3 * 60 + 2 * 10 + 1 * 10 + 2 * 10
    assert result.mean_gpus_in_use == pytest.approx(in_use / 120.0)
    assert result.peak_demand == pytest.approx(0.5 + 0.5 + 1.0 + 0.75)
    # Most stranded over [50, 90): a leaves 0.5 of n000-g0, e 0.25 of n000-g1. A half pod (2/3
    # of the shared mix) fits on g0 and cannot use g1's 0.25; a 0.75 pod (1/3) fits nowhere:
    # all 0.75 is stranded for it. On n001, c leaves one idle GPU: of no use to a 2-GPU pod
    # (half the exclusive mix).
    assert result.max_stranded == pytest.approx(2 / 3 * 0.25 + 1 / 3 * 0.75 + 1 / 2 * 1.0)
    assert result.never_placed == 0


def test_it_places_exclusive_pods_through_the_allocator():
    pods = [Pod("a", 0, 100, 1, 0.5), Pod("b", 0, 100, 1, 0.5), Pod("c", 0, 100, 1, 1.0)]
    devices = cluster(1, 2)
    placer = AllocatorPlacer(devices)
    result = PackingReplay(pods, devices, placer, pool_workloads(pods, False)).run()
    assert (result.peak_gpus_in_use, result.waited) == (2, 1)  # c waits for a whole GPU


def test_it_takes_each_pools_typical_workload_from_its_own_pods():
    assert pool_workloads(PODS, True) == {
        True: (((1, 0.5), 2 / 3), ((1, 0.75), 1 / 3)),
        False: (((1, 1.0), 0.5), ((2, 1.0), 0.5)),
    }
    assert pool_workloads(PODS, False) == {False: (((1, 1.0), 0.8), ((2, 1.0), 0.2))}


def test_it_prints_calib_a_table_and_a_json_line(tmp_path, capsys):
    rows = [f"p{i},,{i * 10},{100 + i},1,{0.25 if i % 2 else 1}" for i in range(12)]
    path = write(tmp_path, rows)
    args = ["--trace", path, "--nodes", "2", "--shared-nodes", "1", "--gpus-per-node", "4"]
    assert bench_packing.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert "calib_s" in json.loads(out[0])
    assert out[2].startswith("| placer | peak GPUs in use")
    assert [line.split(" | ")[0] for line in out[4:8]] == [
        f"| {name}" for name in bench_packing.PLACERS
    ]
    summary = json.loads(out[-1])
    runs = summary["runs"]
    assert summary["pods"] == 6  # the second half
    for kind in ("allocator", "first-fit"):
        shared, exclusive = runs[f"{kind}-shared"], runs[f"{kind}-exclusive"]
        # Three quarter-GPU pods share one GPU instead of holding three.
        assert shared["peak_gpus_in_use"] < exclusive["peak_gpus_in_use"]


def test_it_refuses_an_unknown_placer(capsys):
    with pytest.raises(SystemExit):
        bench_packing.main(["--placers", "best-fit"])
    assert "unknown best-fit" in capsys.readouterr().err


OPENB = bench_packing.DEFAULT_TRACE  # ../shared/traces beside the checkout (or its folder)


@pytest.mark.skipif(not OPENB.exists(), reason="the shared traces are not beside the checkout")
def test_it_keeps_sitegens_fraction_table_equal_to_the_openb_trace():
    import sitegen  # benchmarks/ is on the path since bench_packing loaded

    counts: dict[float, int] = {}
    for pod in load_pods(str(OPENB)):
        if pod.fraction < 1:
            counts[pod.fraction] = counts.get(pod.fraction, 0) + 1
    assert dict(sitegen.OPENB_FRACTIONS) == counts


def test_it_packs_fractions_best_fit_through_the_allocator_where_first_fit_does_not():
    devices = cluster(2, 2, shared_nodes=1)
    now = alive(("x", ("n000-g0",), 0.25), ("y", ("n000-g1",), 0.5))
    pending = [Pod("q", 1, 10, 1, 0.25), Pod("w", 1, 10, 1, 1.0)]
    best = AllocatorPlacer(devices).place(1.0, now, pending)
    assert best["q"] == ("n000-g1",)  # leaves 0.25 there rather than 0.5 on g0
    assert best["w"][0].startswith("n001-")  # a whole GPU never goes to a shared one
    assert FirstFit(devices).place(1.0, now, pending)["q"] == ("n000-g0",)


def test_it_adds_shared_nodes_running_fractions_and_pending_fractions_to_the_site():
    import sitegen

    site = sitegen.generate(pending=20, gpus=32, seed=2)
    nodes, devices, running = site.nodes, len(site.devices), len(site.running)
    sitegen.with_shared(site, shared_nodes=2, fractional=30, seed=2)
    shared = [d for d in site.devices if d.shared]
    assert (site.nodes, len(site.devices), len(shared)) == (nodes + 2, devices + 16, 16)
    held: dict[str, float] = {}
    for booking in site.running[running:]:
        (device,) = booking.devices
        held[device] = held.get(device, 0.0) + booking.gpu_fraction
    assert set(held) == {d.id for d in shared}  # every shared GPU runs something
    assert max(held.values()) <= 0.9 + 1e-9
    fractions = [b.gpu_fraction for b in site.pending if b.gpu_fraction is not None]
    assert len(fractions) == 30 and set(fractions) <= set(dict(sitegen.OPENB_FRACTIONS))


class _Overfill:
    """A broken placer: every pod on the first GPU."""

    def __init__(self, devices):
        self.first = devices[0].id

    def place(self, now, alive, pending):
        return {pod.pod_id: (self.first,) for pod in pending}


def test_it_refuses_a_placement_that_overfills_a_gpu():
    devices = cluster(1, 2, shared_nodes=1)
    pods = [Pod("a", 0, 10, 1, 0.75), Pod("b", 0, 10, 1, 0.5)]
    with pytest.raises(RuntimeError, match="pod b: n000-g0 overfilled"):
        PackingReplay(pods, devices, _Overfill(devices), pool_workloads(pods, True)).run()
