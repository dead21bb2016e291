"""Jobs held to their booking's cores and memory (agents/limits.py).

The cgroup v1 tests run REAL jobs in REAL cgroups (this machine kind has the cpuset, cpu and
memory controllers mounted and writable as root): a job reads back its own /proc/self/cgroup,
its cpuset and limits, and a job that allocates past its memory limit is killed by the kernel's
out-of-memory killer in its own cgroup. The cgroup v2 and systemd ways cannot run here (no
unified hierarchy with controllers, no systemd as init): their tests check what they would
write (a cgroup v2 tree in a temporary directory) and the argv a fake `systemd-run` on PATH
receives, with a fake `systemctl` saying how the scope ended.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
import time
from datetime import timedelta
from pathlib import Path

import pytest

from agents import confine, host, limits
from agents.dispatch import Dispatcher
from agents.protocol import DesiredBooking, oom_reason, utcnow

V1 = Path("/sys/fs/cgroup")
needs_v1 = pytest.mark.skipif(
    os.geteuid() != 0
    or not all((V1 / c / "tasks").exists() for c in limits.V1_CONTROLLERS)
    or (V1 / "cgroup.controllers").exists(),
    reason="needs root and the cgroup v1 cpuset, cpu and memory controllers (this machine kind)",
)

# What a job prints of itself: the variables it got, its cgroups, and the limits it can read.
REPORT = (
    "echo CPUS=$GPU_PORTAL_CPUS MEM=$GPU_PORTAL_MEMORY_MIB OMP=$OMP_NUM_THREADS; "
    "cat /proc/self/cgroup; "
    "m=$(sed -n 's/^[0-9]*:memory://p' /proc/self/cgroup); "
    "c=$(sed -n 's/^[0-9]*:cpuset://p' /proc/self/cgroup); "
    "q=$(sed -n 's/^[0-9]*:cpu://p' /proc/self/cgroup); "
    "echo LIMIT=$(cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes); "
    "echo CPUSET=$(cat /sys/fs/cgroup/cpuset$c/cpuset.cpus); "
    "echo QUOTA=$(cat /sys/fs/cgroup/cpu$q/cpu.cfs_quota_us); "
    'python3 -c \'import os; print("AFFINITY=" + ",".join(map(str, sorted(os.sched_getaffinity(0)))))\''
)
# Writes (and so touches) 200 MiB: past a 64 MiB limit.
HOG = "python3 -c 'x = b\"x\" * (200 << 20); print(len(x))'"


def _events(portal, kind, booking_id):
    return [e for e in portal.events() if e.kind == kind and e.booking_id == booking_id]


def _value(tail: str, name: str) -> str:
    return re.search(rf"^{name}=(.*)$", tail, re.M)[1]


@needs_v1
@pytest.mark.parametrize("mode", ["cgroup", "off"])
def test_it_runs_a_job_in_its_cores_and_memory_for_real(portal, make_agent, cycle_until, me, mode):
    # With the devices cgroup (cgroup) and without it (off): the limits hold either way.
    agent = make_agent(confine=mode)
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, me, [gpu0], command=REPORT, cpus=1, memory_mib=64)
    cycle_until(agent, lambda: _events(portal, "exited", 1))
    started, exited = _events(portal, "started", 1)[0], _events(portal, "exited", 1)[0]
    core = _value(exited.log_tail, "AFFINITY")
    assert f"limited by cgroup v1 to 1 CPU(s) on core(s) {core} and 64 MiB of memory" in (
        started.detail
    )
    assert "CPUS=1 MEM=64 OMP=1" in exited.log_tail
    for controller in ("cpuset", "cpu", "memory"):
        assert re.search(rf":{controller}:/gpu-portal/{agent.hostname}/booking-1-", exited.log_tail)
    assert _value(exited.log_tail, "LIMIT") == str(64 * 1024 * 1024)
    assert _value(exited.log_tail, "CPUSET") == core
    assert _value(exited.log_tail, "QUOTA") == "100000"
    assert exited.exit_code == 0 and exited.oom_limit_mib is None
    homes = [V1 / c / "gpu-portal" / agent.hostname for c in limits.V1_CONTROLLERS]
    assert not [g for home in homes for g in home.glob("booking-1-*")]  # removed after the job


@needs_v1
def test_it_stops_a_job_over_its_memory_by_its_own_limit_and_its_neighbour_runs_on(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent(confine="cgroup")
    gpu0, gpu1 = (g.uuid for g in agent.backend.discover())
    done = tmp_path / "neighbour-done"
    portal.book(1, me, [gpu0], command=HOG, cpus=1, memory_mib=64)
    portal.book(2, me, [gpu1], command=f"sleep 8; touch {done}", cpus=1, memory_mib=64)
    cycle_until(agent, lambda: _events(portal, "exited", 1), timeout_s=30)
    killed = _events(portal, "exited", 1)[0]
    assert killed.oom_limit_mib == 64
    assert killed.detail == oom_reason(64) == "killed by its memory limit of 64 MiB (out of memory)"
    assert killed.exit_code == -9  # SIGKILL, from the kernel's OOM killer in its cgroup
    assert 2 in agent.dispatcher.jobs and not done.exists()  # the neighbour still runs
    cycle_until(agent, lambda: _events(portal, "exited", 2), timeout_s=30)
    neighbour = _events(portal, "exited", 2)[0]
    assert (neighbour.exit_code, neighbour.oom_limit_mib, done.exists()) == (0, None, True)
    # Two jobs of one core each on this two-core machine: each has a core of its own.
    cores = {_events(portal, "started", i)[0].detail.split("core(s) ")[1][:1] for i in (1, 2)}
    assert cores == {"0", "1"}


@needs_v1
def test_it_runs_a_booking_without_cores_or_memory_as_before(portal, make_agent, cycle_until, me):
    # An older portal names neither: no limit cgroup, no variables, the note says nothing of it.
    agent = make_agent(confine="cgroup")
    portal.book(1, me, [agent.backend.discover()[0].uuid], command=REPORT)
    cycle_until(agent, lambda: _events(portal, "exited", 1))
    started, exited = _events(portal, "started", 1)[0], _events(portal, "exited", 1)[0]
    assert "limited" not in started.detail
    assert "CPUS= MEM= OMP=" in exited.log_tail
    assert re.search(r":devices:/gpu-portal/", exited.log_tail)
    assert not re.search(r":(cpuset|memory|cpu):/gpu-portal/", exited.log_tail)


def test_it_lets_a_job_set_its_own_omp_num_threads(portal, make_agent, cycle_until, me):
    agent = make_agent(confine="off")
    portal.book(
        1,
        me,
        [agent.backend.discover()[0].uuid],
        command="echo OMP=$OMP_NUM_THREADS CPUS=$GPU_PORTAL_CPUS",
        cpus=4,
        env=[{"name": "OMP_NUM_THREADS", "value": "2"}],
    )
    cycle_until(agent, lambda: _events(portal, "exited", 1))
    assert "OMP=2 CPUS=4" in _events(portal, "exited", 1)[0].log_tail


# -- picking cores --------------------------------------------------------------------------

TWO_SOCKETS = host.HostResources(tuple(range(8)), 1024, ((0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))))

PICKS = [
    # (count, taken, near NUMA nodes) -> cores
    ((2, set(), {1}), (4, 5)),  # next to the GPUs
    ((2, {4, 5}, {1}), (6, 7)),  # not another job's
    ((3, {4, 5, 6}, {1}), (0, 1, 7)),  # the GPUs' node is full: the rest elsewhere
    ((2, set(), set()), (0, 1)),  # no topology: lowest first
    ((3, set(range(7)), {0}), (0, 1, 7)),  # more than are free: free ones first, then held
    ((20, set(), {0}), tuple(range(8))),  # more than the machine has (a simulated node)
]


@pytest.mark.parametrize(("args", "cores"), PICKS)
def test_it_picks_free_cores_next_to_the_gpus_first(args, cores):
    count, taken, near = args
    assert limits.pick_cores(count, TWO_SOCKETS, taken, near) == cores


def _booking(**more) -> DesiredBooking:
    now = utcnow()
    return DesiredBooking(1, "ann", ["GPU-1"], now, now + timedelta(hours=1), "true", **more)


def test_it_takes_the_portals_cores_only_when_the_node_has_them():
    got = limits.job_limits(_booking(cpus=2, cpu_list="6-7"), TWO_SOCKETS, set(), {0})
    assert (got.cpu_list, got.mems) == ((6, 7), (1,))
    with pytest.raises(host.HostError, match="not a list of this node's cores"):
        limits.job_limits(_booking(cpus=2, cpu_list="8-9"), TWO_SOCKETS, set(), set())
    assert limits.job_limits(_booking(), TWO_SOCKETS, set(), set()) is None


# -- what each way writes -----------------------------------------------------------------

JOB = limits.JobLimits(cpus=4, cpu_list=(4, 5, 6, 7), mems=(1,), memory_mib=64 * 1024)


def test_it_writes_cgroup_v1_limits_in_the_order_the_kernel_takes_them():
    assert limits.v1_writes(JOB) == [
        ("cpuset", "cpuset.cpus", "4-7"),
        ("cpuset", "cpuset.mems", "1"),
        ("cpu", "cpu.cfs_period_us", "100000"),
        ("cpu", "cpu.cfs_quota_us", "400000"),
        ("memory", "memory.limit_in_bytes", str(64 << 30)),
        ("memory", "memory.memsw.limit_in_bytes", str(64 << 30)),
    ]


def test_it_makes_a_cgroup_v2_job_group_with_its_controllers_enabled(tmp_path):
    # A cgroup v2 mount stand-in (a temporary directory): the files the kernel would have.
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    cgroups = limits.CgroupLimits(tmp_path, "gpu-a01")
    assert (cgroups.v2, cgroups.version) == (True, "cgroup v2")
    (group,) = cgroups.make("booking-7-abc", JOB)
    assert group == tmp_path / "gpu-portal" / "gpu-a01" / "booking-7-abc"
    for level in (tmp_path, tmp_path / "gpu-portal", tmp_path / "gpu-portal" / "gpu-a01"):
        assert (level / "cgroup.subtree_control").read_text() == "+cpuset +cpu +memory"
    written = {p.name: p.read_text() for p in group.iterdir()}
    assert written == {
        "cpuset.cpus": "4-7",
        "cpuset.mems": "1",
        "cpu.max": "400000 100000",
        "memory.max": str(64 << 30),
    }
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    assert limits.oom_killed([group], -9)
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\n")
    assert not limits.oom_killed([group], -9)


def test_it_reads_a_v1_oom_kill_and_an_older_kernels_failcnt(tmp_path):
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert limits.oom_killed([tmp_path], 0)
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    (tmp_path / "memory.failcnt").write_text("12\n")
    assert limits.oom_killed([tmp_path], -9) and not limits.oom_killed([tmp_path], 1)


@pytest.fixture
def fake_systemd(tmp_path, monkeypatch):
    """`systemd-run` and `systemctl` stand-ins on PATH: the first records its argv and runs the
    command after `--`; the second says the scope ended by an OOM kill and records its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    scripts = {
        "systemd-run": f'echo "$@" >> {calls}\nwhile [ "$1" != "--" ]; do shift; done\nshift\n'
        'exec "$@"\n',
        "systemctl": f'echo systemctl "$@" >> {calls}\ncase "$1" in show) echo oom-kill;; esac\n',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


def test_it_gives_a_systemd_scope_its_limits_and_reads_how_it_ended(tmp_path, fake_systemd, me):
    dispatcher = Dispatcher(
        tmp_path / "state",
        min_uid=0,
        confinement=confine.SystemdScope(v2=True),
        machine=TWO_SOCKETS,
        gpu_numa={"GPU-1": 1},
        default_workdir=str(tmp_path),
    )
    now = utcnow()
    booking = DesiredBooking(
        1, me, ["GPU-1"], now, now + timedelta(hours=1), "true", cpus=2, memory_mib=1024
    )
    (started,) = dispatcher.reconcile([booking], now)
    assert "limited to 2 CPU(s) on core(s) 4-5 and 1 GiB of memory" in started.detail
    events, deadline = [], time.monotonic() + 10
    while not events and time.monotonic() < deadline:
        time.sleep(0.05)
        events = dispatcher.reconcile([booking], utcnow())
    (exited,) = events
    assert (exited.oom_limit_mib, exited.detail) == (1024, oom_reason(1024))
    # The fake ran before its command, so its argv is written by now.
    argv = fake_systemd.read_text().splitlines()[0].split()
    assert "--collect" not in argv  # its Result is read when it ends
    props = [argv[i + 1] for i, word in enumerate(argv) if word == "-p"]
    assert props[-5:] == [
        "AllowedCPUs=4-5",
        "AllowedMemoryNodes=1",
        "CPUQuota=200%",
        f"MemoryMax={1 << 30}",
        "MemorySwapMax=0",
    ]
    unit = next(w for w in argv if w.startswith("--unit=")).removeprefix("--unit=")
    asked = fake_systemd.read_text()
    assert f"systemctl show --property=Result --value {unit}" in asked
    assert f"systemctl reset-failed --quiet {unit}" in asked


def test_it_says_memorylimit_and_no_cpuset_to_systemd_on_cgroup_v1():
    assert limits.systemd_properties(JOB, v2=False) == [
        "CPUQuota=400%",
        f"MemoryLimit={64 << 30}",
    ]


@needs_v1
def test_it_keeps_a_readopted_jobs_cgroups_and_cores_after_an_agent_restart(
    portal, make_agent, cycle_until, me
):
    first = make_agent(confine="cgroup")
    gpu0, gpu1 = (g.uuid for g in first.backend.discover())
    portal.book(1, me, [gpu0], command="sleep 30", cpus=1, memory_mib=64)
    cycle_until(first, lambda: 1 in first.dispatcher.jobs)
    held = first.dispatcher.jobs[1]
    first.close()  # the job runs on, for the next agent to re-adopt
    again = make_agent(confine="cgroup")
    assert again.dispatcher.jobs[1].cpu_list == held.cpu_list
    groups = held.confinement.removeprefix("cgroup:").split(";")
    assert len(groups) == 4 and all(Path(g).is_dir() for g in groups)  # not swept
    portal.book(2, me, [gpu1], command="sleep 30", cpus=1, memory_mib=64)
    cycle_until(again, lambda: 2 in again.dispatcher.jobs)
    assert again.dispatcher.jobs[2].cpu_list != held.cpu_list  # the other core
    portal.desired["bookings"].clear()
    cycle_until(again, lambda: not again.dispatcher.jobs)
    assert not any(Path(g).exists() for g in groups)


@pytest.mark.skipif(os.geteuid() != 0, reason="the limits are only a root agent's")
def test_it_limits_what_it_can_where_a_node_has_some_controllers(tmp_path, me):
    # A cgroup v1 stand-in with the memory controller alone (a temporary directory).
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "tasks").write_text("")
    cgroups = limits.CgroupLimits(tmp_path, "n1")
    account = pwd.getpwnam(me)
    launch = confine.NoConfinement("off", cgroups).wrap(1, ["true"], account, [], JOB)
    joined = [launch.argv[i + 1] for i, word in enumerate(launch.argv) if word == "--cgroup"]
    (group,) = map(Path, joined)
    assert group.parent == tmp_path / "memory" / "gpu-portal" / "n1"
    assert (group / "memory.limit_in_bytes").read_text() == str(64 << 30)
    assert not (group / "memory.memsw.limit_in_bytes").exists()  # no swap accounting here
    assert launch.note.endswith(f"(no cpuset, cpu controller under {tmp_path})")
    assert "limited by cgroup v1 to 4 CPU(s) on core(s) 4-7 and 64 GiB of memory" in launch.note
    bare = limits.CgroupLimits(tmp_path / "none", "n1")
    unheld = confine.NoConfinement("off", bare).wrap(2, ["true"], account, [], JOB)
    assert unheld.argv == ["true"] and unheld.note.endswith(
        f"not limited (no cpuset, cpu or memory controller under {tmp_path / 'none'})"
    )


def test_it_gives_podman_and_docker_the_jobs_cores_and_memory_and_apptainer_nothing_more():
    from agents.containers import container_launch

    common = dict(
        booking_id=7,
        command="python train.py",
        device_uuids=["GPU-a"],
        uid=1001,
        gid=1002,
        env={},
        workdir="/home/ann",
        extra_args={"docker": ["--network", "none"]},
        resources=limits.oci_options(JOB),
    )
    docker = container_launch(runtimes=["docker"], image="nvcr.io/nvidia/pytorch:24.05", **common)
    size = f"{64 << 30}b"
    expected = ["--cpuset-cpus=4-7", "--cpus=4", f"--memory={size}", f"--memory-swap={size}"]
    at = docker.argv.index("--network")
    assert docker.argv[at - 4 : at] == expected  # before the site's options and the image
    # Apptainer runs in the job's own cgroups, which hold it: no options of its own.
    sif = container_launch(runtimes=["apptainer"], image="/shared/torch.sif", **common)
    assert not any(word.startswith(("--cpus", "--memory")) for word in sif.argv)
    assert limits.oci_options(None) == []
