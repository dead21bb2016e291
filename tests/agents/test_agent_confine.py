"""Jobs confined to their booked devices: a real cgroup per job, enforced by the kernel.

The simulated GPUs get real character device nodes (mknod, major 195 as NVIDIA's): opening a
node the cgroup allows fails with ENXIO (no driver behind it), one it denies with EPERM. So the
difference the tests read is the kernel's device filter, not anything the agent reports.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import confine
from agents.procfs import is_alive, read_stat

CGROUP_ROOT = confine.CGROUP_V1_DEVICES

needs_cgroup = pytest.mark.skipif(
    os.geteuid() != 0 or not (CGROUP_ROOT / "devices.allow").exists(),
    reason="needs root and the cgroup v1 devices controller (this machine kind has both)",
)


def _events(portal, kind, booking_id):
    return [e for e in portal.events() if e.kind == kind and e.booking_id == booking_id]


@pytest.fixture
def nodes(tmp_path):
    """/dev-like nodes for the first two simulated GPUs (NVIDIA's major 195, minors 0 and 1)."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    devdir = tmp_path / "dev"
    devdir.mkdir()
    for minor in (0, 1):
        os.mknod(devdir / f"nvidia{minor}", 0o666 | 0o020000, os.makedev(195, minor))
    return devdir


def _home(agent) -> Path:
    return CGROUP_ROOT / "gpu-portal" / agent.hostname


def _probe(devdir: Path) -> str:
    # cat reports how open() failed: ENXIO "No such device or address" or EPERM.
    return f"for d in nvidia0 nvidia1; do cat {devdir}/$d; done; echo null > /dev/null && echo ok"


@needs_cgroup
def test_it_lets_a_job_open_only_its_booked_gpus_node(portal, make_agent, cycle_until, me, nodes):
    agent = make_agent(confine="cgroup", device_dir=str(nodes))
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, me, [gpu0], command=_probe(nodes))
    cycle_until(agent, lambda: _events(portal, "exited", 1))
    started, exited = _events(portal, "started", 1)[0], _events(portal, "exited", 1)[0]
    assert f"confined by cgroup v1 devices to {nodes}/nvidia0" in started.detail
    assert "nvidia1" not in started.detail
    assert f"{nodes}/nvidia0: No such device or address" in exited.log_tail
    assert f"{nodes}/nvidia1: Operation not permitted" in exited.log_tail
    assert exited.log_tail.endswith("ok\n")  # the pseudo devices stay usable
    assert not list(_home(agent).glob("booking-1-*"))  # removed after the job


@needs_cgroup
def test_it_says_when_a_job_is_not_confined_and_then_cannot_stop_it(
    portal, make_agent, cycle_until, me, nodes
):
    # The control for the test above: without confinement the other GPU's node opens (ENXIO).
    agent = make_agent(confine="off", device_dir=str(nodes))
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(2, me, [gpu0], command=_probe(nodes))
    cycle_until(agent, lambda: _events(portal, "exited", 2))
    started, exited = _events(portal, "started", 2)[0], _events(portal, "exited", 2)[0]
    assert "not confined: switched off (--confine off)" in started.detail
    assert f"{nodes}/nvidia1: No such device or address" in exited.log_tail


@needs_cgroup
def test_it_confines_a_mig_slice_to_its_parent_and_its_capability_nodes(
    portal, make_agent, cycle_until, me, tmp_path
):
    devdir = tmp_path / "dev"
    (devdir / "nvidia-caps").mkdir(parents=True)
    for name, minor in (
        ("nvidia0", 0),
        ("nvidia-caps/gpu0-mig0", 10),
        ("nvidia-caps/gpu0-mig1", 11),
    ):
        os.mknod(devdir / name, 0o666 | 0o020000, os.makedev(195 if minor == 0 else 511, minor))
    agent = make_agent("1xA100-80GB:mig=2x1g.10gb", confine="cgroup", device_dir=str(devdir))
    mig0 = agent.backend.discover()[0].mig_instances[0].uuid
    probe = (
        f"for d in nvidia0 nvidia-caps/gpu0-mig0 nvidia-caps/gpu0-mig1; do cat {devdir}/$d; done"
    )
    portal.book(3, me, [mig0], command=probe)
    cycle_until(agent, lambda: _events(portal, "exited", 3))
    tail = _events(portal, "exited", 3)[0].log_tail
    assert f"{devdir}/nvidia0: No such device or address" in tail
    assert f"{devdir}/nvidia-caps/gpu0-mig0: No such device or address" in tail
    assert f"{devdir}/nvidia-caps/gpu0-mig1: Operation not permitted" in tail  # the other slice


@needs_cgroup
def test_it_runs_the_confined_job_as_its_user_in_its_own_cgroup(portal, make_agent, cycle_until):
    agent = make_agent(confine="cgroup", user_map={"ann": "nobody"})
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(4, "ann", [gpu0], command="sleep 30")
    cycle_until(agent, lambda: _events(portal, "started", 4))
    pid = _events(portal, "started", 4)[0].pid
    assert os.stat(f"/proc/{pid}").st_uid == pwd.getpwnam("nobody").pw_uid
    assert os.getpgid(pid) == pid  # still its own session and process group after the jail
    cgroups = Path(f"/proc/{pid}/cgroup").read_text()
    assert f":devices:/gpu-portal/{agent.hostname}/booking-4-" in cgroups
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: _events(portal, "stopped", 4))


@needs_cgroup
def test_it_kills_what_a_job_left_running_in_its_cgroup_when_it_ends(
    portal, make_agent, cycle_until, me, tmp_path
):
    # A child in a session of its own escapes the job's process group, not its cgroup.
    pidfile = tmp_path / "escaped.pid"
    command = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' & sleep 0.5; exit 0"
    agent = make_agent(confine="cgroup")
    portal.book(5, me, [agent.backend.discover()[0].uuid], command=command)
    cycle_until(agent, lambda: _events(portal, "exited", 5))
    escaped = int(pidfile.read_text())
    ticks = read_stat(escaped).start_ticks if read_stat(escaped) else 0
    deadline = time.monotonic() + 5
    while is_alive(escaped, ticks) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not is_alive(escaped, ticks)
    assert not list(_home(agent).glob("booking-5-*"))


@needs_cgroup
def test_it_removes_empty_job_cgroups_an_earlier_agent_left_and_keeps_busy_ones(
    portal, make_agent, cycle_until, me, spawn
):
    first = make_agent(confine="cgroup")
    home = _home(first)
    stale, busy = home / "booking-8-dead00", home / "booking-9-live00"
    stale.mkdir(parents=True)
    busy.mkdir()
    sleeper = spawn(["sleep", "30"])
    (busy / "cgroup.procs").write_text(str(sleeper.pid))
    try:
        make_agent(confine="cgroup", state_dir=first.dispatcher._state_dir.parent / "again")
        assert not stale.exists()  # nothing in it: an earlier agent's leftover
        assert busy.exists()  # something still runs in it: not ours to kill
    finally:
        sleeper.kill()
        sleeper.wait()
        confine.release(f"cgroup:{busy}")


def test_it_refuses_to_start_when_the_confinement_asked_for_is_missing(tmp_path):
    missing = tmp_path / "no-such-dir"
    if os.geteuid() == 0 and confine.shutil.which("systemd-run"):
        with pytest.raises(confine.ConfinementError, match="systemd is not the init system"):
            confine.choose("systemd", systemd_dir=missing)
    with pytest.raises(confine.ConfinementError, match="--confine cgroup: no cgroup"):
        confine.choose("cgroup", cgroup_root=tmp_path)
    fallback = confine.choose("auto", systemd_dir=missing, cgroup_root=tmp_path)
    assert isinstance(fallback, confine.NoConfinement)
    assert "no systemd scope" in fallback.reason and "no cgroup" in fallback.reason
    with pytest.raises(confine.ConfinementError, match="choose one of auto, systemd, cgroup, off"):
        confine.choose("strict")


def test_it_asks_systemd_for_a_scope_that_opens_only_the_booked_nodes():
    nobody = pwd.getpwnam("nobody")
    argv = confine.systemd_run_argv(
        "gpu-portal-booking-7-abc.scope", ["/dev/nvidiactl", "/dev/nvidia3"], nobody, ["true"]
    )
    assert argv[:5] == [
        "systemd-run",
        "--scope",
        "--quiet",
        "--collect",
        "--unit=gpu-portal-booking-7-abc.scope",
    ]
    properties = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert properties == [
        "DevicePolicy=closed",
        "DeviceAllow=char-pts rw",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia3 rw",
    ]
    if os.geteuid() != nobody.pw_uid:
        assert f"--uid={nobody.pw_uid}" in argv and f"--gid={nobody.pw_gid}" in argv
    assert argv[-2:] == ["--", "true"]


@pytest.mark.skipif(confine.SYSTEMD_RUN_DIR.is_dir(), reason="systemd is the init here")
def test_it_does_not_start_an_agent_told_to_confine_with_a_missing_systemd():
    run = subprocess.run(
        [sys.executable, "-m", "agents", "--portal", "http://127.0.0.1:9", "--token", "t"]
        + ["--simulate", "1xH100-80GB", "--no-push", "--confine", "systemd"]
        + ["--state-dir", "/tmp/gp-confine-test"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "cannot start: --confine systemd: no systemd scope" in run.stderr
