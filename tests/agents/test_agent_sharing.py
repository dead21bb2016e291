"""Shared GPUs on the node: each tenant's share in its environment, MPS daemons per shared GPU,
and a job that keeps more GPU memory than its share stopped while its neighbour runs on.

Real agent cycles on the simulated backend: a job's simulated GPU memory is what its process's
environment names (GPU_PORTAL_SIM_MEMORY_MIB, agents/simulate.py). This machine has no
nvidia-cuda-mps-control: the MPS tests put a small fake one on PATH that records how it was
called (arguments, the environment it got, what it read on stdin). That is the boundary: the
real daemon's behaviour is NVIDIA's."""

import json
import os
import re
import stat
import subprocess
import time
from datetime import UTC, datetime

import pytest

from agents import protocol
from agents.memshare import MemoryWatch, Tenant, attribute, gib
from agents.procfs import read_environ, read_stat
from agents.sharing import thread_percentage

SPEC = "1xH200-141GB"
SHARE_MIB = 40960


def _uuid(agent):
    return agent.backend.discover()[0].uuid


def _events(portal, kind, booking_id=None):
    return [
        e
        for e in portal.events()
        if e.kind == kind and (booking_id is None or e.booking_id == booking_id)
    ]


def _uses(mib):
    """A job command that keeps `mib` simulated GPU memory until it is stopped."""
    return f"export GPU_PORTAL_SIM_MEMORY_MIB={mib}; exec sleep 300"


def _share(**more):
    return {"gpu_fraction": 0.5, "gpu_memory_mib": SHARE_MIB, **more}


def test_it_stops_the_tenant_over_its_memory_share_and_its_neighbour_runs_on(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent(SPEC, memory_grace_s=1.0)
    gpu = _uuid(agent)
    portal.book(1, me, [gpu], command=_uses(61440), **_share())  # 60 GiB of a 40 GiB share
    portal.book(2, me, [gpu], command=_uses(10240), **_share())  # 10 GiB: well under
    cycle_until(agent, lambda: len(_events(portal, "started")) == 2)
    neighbour = agent.dispatcher.jobs[2]

    cycle_until(agent, lambda: _events(portal, "stopped", 1), timeout_s=30)

    (exceeded,) = _events(portal, "memory_exceeded")
    assert (exceeded.booking_id, exceeded.device_uuid, exceeded.action) == (1, gpu, "kill")
    # 60 GiB, and the job's shells' own plausible simulated memory (agents/simulate.py).
    used = re.fullmatch(
        r"used ([0-9.]+) GiB of GPU memory, over its 40 GiB share, for [0-9]+ s", exceeded.detail
    )
    assert used and 60 <= float(used[1]) < 60 + 3 * 4, exceeded.detail
    (stopped,) = _events(portal, "stopped", 1)
    assert stopped.detail == f"stopped: {exceeded.detail}"
    # The line in the job's own output, which the portal shows as its tail.
    assert f"gpu-portal: stopping the job: it {exceeded.detail}\n" in stopped.log_tail
    out = os.path.join(portal.workdir, protocol.output_file_name(1))
    assert f"it {exceeded.detail}" in open(out).read()
    # Its neighbour on the same GPU runs on, and is never judged over.
    for _ in range(10):
        agent.handle_one_cycle()
    assert 2 in agent.dispatcher.jobs and read_stat(neighbour.pid) is not None
    assert _events(portal, "memory_exceeded", 2) == [] and _events(portal, "stopped", 2) == []
    assert _events(portal, "foreign_process") == []  # both tenants' processes belong there


def test_it_gives_a_shared_job_its_share_in_its_environment(portal, make_agent, cycle_until, me):
    agent = make_agent(SPEC)
    gpu = _uuid(agent)
    portal.book(3, me, [gpu], command="sleep 300", **_share(gpu_fraction=0.25))
    portal.book(4, me, [gpu], command="sleep 300")  # a whole-GPU booking: no share variables
    cycle_until(agent, lambda: len(_events(portal, "started")) == 2)
    names = ("CUDA_VISIBLE_DEVICES", "GPU_PORTAL_GPU_FRACTION", "GPU_PORTAL_GPU_MEMORY_MIB")
    shared = read_environ(agent.dispatcher.jobs[3].pid, (*names, "CUDA_MPS_PIPE_DIRECTORY"))
    assert shared == dict(zip(names, [gpu, "0.25", str(SHARE_MIB)], strict=True))
    assert read_environ(agent.dispatcher.jobs[4].pid, names) == {"CUDA_VISIBLE_DEVICES": gpu}


def test_a_booking_cannot_set_its_own_share_or_mps_variables(portal, make_agent, cycle_until, me):
    agent = make_agent(SPEC)
    gpu = _uuid(agent)
    mine = [
        {"name": "GPU_PORTAL_GPU_MEMORY_MIB", "value": "999999"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=999G"},
    ]
    portal.book(5, me, [gpu], command="sleep 300", env=mine, **_share())
    cycle_until(agent, lambda: _events(portal, "started", 5))
    names = ("GPU_PORTAL_GPU_MEMORY_MIB", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    assert read_environ(agent.dispatcher.jobs[5].pid, names) == {
        "GPU_PORTAL_GPU_MEMORY_MIB": str(SHARE_MIB)
    }
    assert protocol.job_env_reserved("CUDA_MPS_PIPE_DIRECTORY")


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """A fake nvidia-cuda-mps-control on PATH: each call appends {args, env, stdin} to a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "mps-calls.jsonl"
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\n"
        "stdin = '' if '-d' in sys.argv else sys.stdin.read()\n"
        "keep = ('CUDA_VISIBLE_DEVICES', 'CUDA_MPS_PIPE_DIRECTORY', 'CUDA_MPS_LOG_DIRECTORY')\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    env = {k: os.environ[k] for k in keep if k in os.environ}\n"
        "    f.write(json.dumps({'args': sys.argv[1:], 'env': env, 'stdin': stdin}) + '\\n')\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def recorded():
        if not calls.exists():
            return []
        return [json.loads(line) for line in calls.read_text().splitlines()]

    return recorded


def test_it_runs_one_mps_daemon_per_shared_gpu_from_its_first_tenant_to_its_last(
    portal, make_agent, cycle_until, me, fake_mps, tmp_path
):
    agent = make_agent(SPEC, mps=True)
    gpu = _uuid(agent)
    pipe = str(tmp_path / "state" / "mps" / gpu / "pipe")
    logs = str(tmp_path / "state" / "mps" / gpu / "log")
    daemon_env = {
        "CUDA_VISIBLE_DEVICES": gpu,
        "CUDA_MPS_PIPE_DIRECTORY": pipe,
        "CUDA_MPS_LOG_DIRECTORY": logs,
    }
    portal.book(6, me, [gpu], command="sleep 300", **_share(gpu_fraction=0.3))
    portal.book(7, me, [gpu], command="sleep 300", **_share(gpu_memory_mib=20480))
    cycle_until(agent, lambda: len(_events(portal, "started")) == 2)

    assert fake_mps() == [{"args": ["-d"], "env": daemon_env, "stdin": ""}]  # one, for both
    assert oct(os.stat(pipe).st_mode & 0o777) == "0o755"  # every tenant's user reaches it
    mps = ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    mps += ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",)
    assert read_environ(agent.dispatcher.jobs[6].pid, mps) == dict(
        zip(mps, [pipe, "30", f"0={SHARE_MIB}M"], strict=True)
    )
    assert read_environ(agent.dispatcher.jobs[7].pid, mps)[mps[2]] == "0=20480M"

    del portal.desired["bookings"][0]  # the first tenant ends: the daemon stays for the other
    portal.desired["generation"] += 1
    cycle_until(agent, lambda: _events(portal, "stopped", 6))
    assert len(fake_mps()) == 1
    portal.desired["bookings"].clear()  # the last one ends: quit
    portal.desired["generation"] += 1
    cycle_until(agent, lambda: _events(portal, "stopped", 7))
    assert fake_mps()[1:] == [{"args": [], "env": daemon_env, "stdin": "quit\n"}]
    assert agent.mps.tenants == {}


def test_it_gives_whole_gpu_bookings_no_mps_and_quits_daemons_when_it_stops_its_jobs(
    portal, make_agent, cycle_until, me, fake_mps
):
    agent = make_agent("2xH100-80GB", mps=True, stop_jobs_on_exit_s=1.0)
    shared, whole = (gpu.uuid for gpu in agent.backend.discover())
    portal.book(8, me, [whole], command="sleep 300")
    cycle_until(agent, lambda: _events(portal, "started", 8))
    assert fake_mps() == []
    assert "CUDA_MPS_PIPE_DIRECTORY" not in read_environ(
        agent.dispatcher.jobs[8].pid, ("CUDA_MPS_PIPE_DIRECTORY",)
    )
    portal.book(9, me, [shared], command="sleep 300", **_share())
    cycle_until(agent, lambda: _events(portal, "started", 9))
    agent.close()
    assert [call["args"] for call in fake_mps()] == [["-d"], []]
    assert fake_mps()[1]["env"]["CUDA_VISIBLE_DEVICES"] == shared


def test_a_restarted_agent_keeps_the_mps_daemon_of_the_tenants_it_readopts(
    portal, make_agent, cycle_until, me, fake_mps
):
    first = make_agent(SPEC, mps=True)
    gpu = _uuid(first)
    portal.book(11, me, [gpu], command="sleep 300", **_share())
    cycle_until(first, lambda: _events(portal, "started", 11))
    first.close()  # the job runs on under its daemon: nothing is quit
    assert [call["args"] for call in fake_mps()] == [["-d"]]

    second = make_agent(SPEC, mps=True)
    assert second.mps.tenants == {gpu: {11}}
    portal.book(12, me, [gpu], command="sleep 300", **_share())
    cycle_until(second, lambda: _events(portal, "started", 12))
    assert [call["args"] for call in fake_mps()] == [["-d"]]  # joined the running daemon
    portal.desired["bookings"].clear()
    portal.desired["generation"] += 1
    cycle_until(second, lambda: _events(portal, "stopped", 11) and _events(portal, "stopped", 12))
    assert [call["args"] for call in fake_mps()] == [["-d"], []]  # the last one left: quit


def test_it_does_not_launch_a_shared_job_whose_mps_daemon_will_not_start(
    portal, make_agent, cycle_until, me, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-cuda-mps-control there
    agent = make_agent(SPEC, mps=True)
    portal.book(10, me, [_uuid(agent)], command="sleep 300", **_share())
    cycle_until(agent, lambda: _events(portal, "exited", 10))
    (exited,) = _events(portal, "exited", 10)
    assert (
        exited.detail
        == f"not launched: nvidia-cuda-mps-control -d did not start for {_uuid(agent)}"
    )
    assert agent.mps.tenants == {}


# -- the memory watch on its own: hand-made readings, a hand-driven clock -------------------


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _reading(uuid, *procs):
    """A reading whose processes are (pid, MiB, booking id) as agents.memshare.attribute left them."""
    processes = [protocol.ProcessReading(pid, "u", mib, "python", pk) for pid, mib, pk in procs]
    return protocol.DeviceReading(uuid, 50.0, 10.0, 0, 81920, 40.0, 100.0, processes)


@pytest.mark.parametrize(
    ("used", "share", "seconds", "over"),
    [
        (20481, 20480, 30, True),  # a MiB over, for the whole grace
        (20480, 20480, 60, False),  # at the share is within it
        (40000, 20480, 29.9, False),  # not yet the grace
        (None, 20480, 60, False),  # NVML cannot say: never stopped for it
    ],
)
def test_it_judges_a_tenant_over_only_after_the_grace(used, share, seconds, over):
    clock = _Clock()
    watch = MemoryWatch(30.0, clock)
    tenant = Tenant(1, "GPU-a", share)
    reading = [_reading("GPU-a", (100, used, 1))]
    assert watch.check(reading, [tenant]) == []
    clock.now = seconds
    found = watch.check(reading, [tenant])
    assert bool(found) == over
    if over:
        # GiB would hide the difference: MiB then.
        assert found[0].reason() == (
            "used 20481 MiB of GPU memory, over its 20480 MiB share, for 30 s"
        )


def test_it_starts_the_grace_afresh_when_a_tenant_comes_back_under():
    clock = _Clock()
    watch = MemoryWatch(30.0, clock)
    tenant = Tenant(1, "GPU-a", 1000)
    for now, used in ((0, 5000), (20, 500), (40, 5000), (69, 5000)):
        clock.now = now
        assert watch.check([_reading("GPU-a", (100, used, 1))], [tenant]) == []
    clock.now = 70
    (over,) = watch.check([_reading("GPU-a", (100, 5000, 1))], [tenant])
    assert over.over_s == 30 and over.used_mib == 5000
    clock.now = 100
    assert watch.check([_reading("GPU-a", (100, 5000, 1))], [tenant]) == []  # told once


def test_it_adds_up_a_tenants_processes_on_its_gpu_alone():
    watch = MemoryWatch(0.0, _Clock())
    tenants = [Tenant(1, "GPU-a", 1000), Tenant(2, "GPU-a", 1000)]
    readings = [
        _reading("GPU-a", (100, 600, 1), (101, 600, 1), (102, 900, 2), (103, 5000, None)),
        _reading("GPU-b", (104, 5000, 2)),  # not its shared GPU
    ]
    (over,) = watch.check(readings, tenants)
    assert (over.booking_id, over.used_mib) == (1, 1200)


def test_it_attributes_a_process_by_its_jobs_group_else_by_its_environment():
    me = os.getpid()
    env = {"PATH": "/usr/bin:/bin", "GPU_PORTAL_BOOKING_ID": "7"}
    named = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    try:
        _attributes(me, named.pid)
    finally:
        named.kill()
        named.wait()


def _attributes(me, named):
    # Right after exec the kernel may not show the new environment yet (Popen returns once the
    # old one is gone); the agent reads it afresh every cycle, so wait for it here.
    deadline = time.monotonic() + 5
    while not read_environ(named, ("GPU_PORTAL_BOOKING_ID",)) and time.monotonic() < deadline:
        time.sleep(0.01)
    readings = [_reading("GPU-a", (me, 100, None), (named, 100, None))]
    jobs = {read_stat(me).pgid: 3}
    holding = {"GPU-a": {3, 7}}
    found = attribute(readings, jobs, holding)
    assert [p.booking_id for p in found[0].processes] == [3, 7]
    # A booking that does not hold the device is no owner there, whatever a process says.
    found = attribute(readings, jobs, {"GPU-a": {3}})
    assert [p.booking_id for p in found[0].processes] == [3, None]
    assert attribute(readings, jobs, {})[0].processes[0].booking_id is None


def test_it_writes_gib_to_a_tenth():
    assert [gib(m) for m in (20480, 31232, 61440, 1000)] == ["20", "30.5", "60", "1"]


def test_it_gives_mps_a_whole_percentage_of_at_least_one():
    assert [thread_percentage(f) for f in (0.5, 0.25, 0.333, 0.001, 1.0)] == [50, 25, 34, 1, 100]


def test_the_event_carrying_the_reason_is_one_the_portal_reads():
    event = protocol.Event(
        "memory_exceeded",
        datetime(2026, 12, 4, tzinfo=UTC),
        "used 60 GiB of GPU memory, over its 40 GiB share, for 30 s",
        1,
        device_uuid="GPU-a",
        action="kill",
    )
    body = protocol.to_json(protocol.EventsRequest([event]))
    assert protocol.from_json(protocol.EventsRequest, body, strict=True).events == [event]


def test_the_command_line_turns_mps_on_and_sets_the_memory_grace():
    from agents.__main__ import build_parser

    base = ["--portal", "http://portal.example"]
    args = build_parser().parse_args([*base, "--mps", "--gpu-memory-grace", "5"])
    assert (args.mps, args.gpu_memory_grace) == (True, 5.0)
    defaults = build_parser().parse_args(base)
    assert (defaults.mps, defaults.gpu_memory_grace) == (False, 30.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--gpu-memory-grace", "-1"])


def test_a_process_of_no_tenant_on_a_shared_gpu_is_foreign_to_all_of_them(
    portal, make_agent, cycle_until, me, spawn, as_root
):
    agent = make_agent(SPEC)
    gpu = _uuid(agent)
    portal.book(13, me, [gpu], **_share())
    portal.book(14, me, [gpu], **_share())
    intruder = spawn(["sleep", "30"], cuda_devices=gpu, user="nobody")
    cycle_until(agent, lambda: _events(portal, "foreign_process"))
    (event,) = _events(portal, "foreign_process")
    assert (event.pid, event.user, event.booking_id) == (intruder.pid, "nobody", 13)
    assert event.detail.endswith(f"booked by {me} (booking 13), {me} (booking 14)")
