"""A batch job's environment on the node: launch variables, working directory, output file,
variables of its own, the end file, and the warning signal before its end or an early stop."""

import os
import signal
import subprocess
import sys
import time
import typing
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agents import jobenv, protocol
from agents.agent import Agent
from agents.session import free_port
from agents.simulate import SimulatedBackend
from tests.agents.conftest import TOKEN, StandInPortal

RENDEZVOUS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "rendezvous.py"


def _gpu_uuids(agent):
    return [gpu.uuid for gpu in agent.backend.discover()]


def _event(portal, kind, booking_id):
    return next((e for e in portal.events() if e.kind == kind and e.booking_id == booking_id), None)


def _env_of(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_it_gives_each_node_of_a_booking_its_launch_variables_and_a_hostfile(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    gpus = _gpu_uuids(agent)
    nodes = [
        {"hostname": "gpu-a01", "address": "10.0.0.1", "slots": 8},
        {"hostname": agent.hostname, "address": "10.0.0.2", "slots": 2},
    ]
    command = "env; echo hostfile:; cat $GPU_PORTAL_HOSTFILE"
    portal.book(1, me, gpus, command=command, nodes=nodes, node_rank=1, master_port=29517)
    cycle_until(agent, lambda: _event(portal, "exited", 1))
    exited = _event(portal, "exited", 1)
    assert exited.exit_code == 0
    env = _env_of(Path(portal.workdir, "gpu-portal-1.1.out").read_text())  # rank 1
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK")} == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29517",
        "WORLD_SIZE": "10",
        "NODE_RANK": "1",
    }
    assert env["LOCAL_WORLD_SIZE"] == "2"
    assert env["GPU_PORTAL_NNODES"] == "2"
    assert env["GPU_PORTAL_NODELIST"] == f"gpu-a01,{agent.hostname}"
    assert env["GPU_PORTAL_RESTART_COUNT"] == "0"
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(gpus)
    assert exited.log_tail.endswith(f"hostfile:\ngpu-a01 slots=8\n{agent.hostname} slots=2\n")


def test_it_launches_no_rank_of_a_multi_node_booking_before_its_port_is_known(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    nodes = [
        {"hostname": agent.hostname, "address": "127.0.0.1", "slots": 2},
        {"hostname": "gpu-b01", "address": "10.0.0.2", "slots": 2},
    ]
    portal.book(8, me, _gpu_uuids(agent), command="true", nodes=nodes, node_rank=0)
    for _ in range(5):
        agent.handle_one_cycle()
    assert _event(portal, "started", 8) is None
    portal.desired["bookings"][0]["master_port"] = free_port("127.0.0.1")
    portal.desired["generation"] += 1
    cycle_until(agent, lambda: _event(portal, "exited", 8))


def test_it_runs_in_the_working_directory_with_the_bookings_variables(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    workdir = tmp_path / "project"
    workdir.mkdir()
    env = [{"name": "LR", "value": "3e-4"}, {"name": "NOTE", "value": 'it\'s "quoted" $HOME'}]
    portal.book(
        2,
        me,
        _gpu_uuids(agent)[:1],
        command='pwd; echo $LR; echo "$NOTE"; echo oops >&2; exit 4',
        workdir=str(workdir),
        env=env,
    )
    cycle_until(agent, lambda: _event(portal, "exited", 2))
    exited = _event(portal, "exited", 2)
    assert exited.exit_code == 4
    output = (workdir / "gpu-portal-2.out").read_text()
    assert output == f'{workdir}\n3e-4\nit\'s "quoted" $HOME\noops\n'
    assert exited.log_tail == output
    # The variables never reach the agent's own launch (a wrapper that may still be root).
    assert "LR" not in open(f"/proc/{os.getpid()}/environ").read()


def test_it_keeps_its_own_device_variables_whatever_the_booking_asks(
    portal, make_agent, cycle_until, me
):
    # A portal that let them through (an older one) must still not widen the job's devices.
    agent = make_agent()
    gpus = _gpu_uuids(agent)
    env = [
        {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(gpus)},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "APPTAINERENV_CUDA_VISIBLE_DEVICES", "value": "all"},
        {"name": "LR", "value": "3e-4"},
    ]
    portal.book(5, me, gpus[:1], command="env", env=env)
    cycle_until(agent, lambda: _event(portal, "exited", 5))
    seen = _env_of(_event(portal, "exited", 5).log_tail)
    assert seen["CUDA_VISIBLE_DEVICES"] == gpus[0]
    assert "NVIDIA_VISIBLE_DEVICES" not in seen and "APPTAINERENV_CUDA_VISIBLE_DEVICES" not in seen
    assert seen["LR"] == "3e-4"


def test_it_sets_the_runtimes_device_variables_after_the_bookings_own(tmp_path, me):
    # What a container runtime is started with: the launch script execs `run` (here env, in
    # place of apptainer) with the agent's NVIDIA_VISIBLE_DEVICES and APPTAINERENV_*.
    booking = protocol.from_json(
        protocol.DesiredBooking,
        {
            "booking_id": 6,
            "owner": me,
            "device_uuids": ["GPU-b"],
            "start": "2030-01-01T00:00:00Z",
            "end": "2030-01-01T01:00:00Z",
            "command": "true",
            "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"},
                {"name": "SINGULARITYENV_CUDA_VISIBLE_DEVICES", "value": "all"},
                {"name": "APPTAINERENV_CUDA_VISIBLE_DEVICES", "value": "all"},
            ],
        },
    )
    files = jobenv.JobFiles(tmp_path / "job", str(tmp_path), str(tmp_path / "out"))
    agent_env = {
        "PATH": os.environ["PATH"],
        "CUDA_VISIBLE_DEVICES": "GPU-b",
        "NVIDIA_VISIBLE_DEVICES": "GPU-b",
        "APPTAINERENV_CUDA_VISIBLE_DEVICES": "GPU-b",
    }
    nodes = jobenv.placement(booking, "gpu-a01", "10.0.0.1")
    argv = jobenv.write_job_files(booking, files, nodes, run=["env"], agent_env=agent_env)
    with open(files.script, "rb") as script:
        subprocess.run(argv, stdin=script, env=agent_env, cwd=tmp_path, check=True)
    seen = _env_of((tmp_path / "gpu-portal-6.out").read_text())
    devices = {k: v for k, v in seen.items() if k.startswith(("CUDA_", "NVIDIA_", "APPT", "SING"))}
    assert devices == {
        "CUDA_VISIBLE_DEVICES": "GPU-b",
        "NVIDIA_VISIBLE_DEVICES": "GPU-b",
        "APPTAINERENV_CUDA_VISIBLE_DEVICES": "GPU-b",
    }


def test_it_fails_a_job_whose_working_directory_cannot_be_entered(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    missing = tmp_path / "no-such-dir"
    portal.book(3, me, _gpu_uuids(agent)[:1], command="echo ran", workdir=str(missing))
    cycle_until(agent, lambda: _event(portal, "exited", 3))
    exited = _event(portal, "exited", 3)
    assert exited.exit_code == jobenv.EXIT_NO_WORKDIR
    assert str(missing) in exited.log_tail
    assert "ran" not in exited.log_tail


def test_it_never_reads_an_output_file_that_is_a_symlink(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    secret = tmp_path / "secret"
    secret.write_text("not yours\n")
    Path(portal.workdir, "gpu-portal-4.out").symlink_to(secret)
    portal.book(4, me, _gpu_uuids(agent)[:1], command="echo mine")
    cycle_until(agent, lambda: _event(portal, "exited", 4))
    assert "not yours" not in (_event(portal, "exited", 4).log_tail or "")


def test_it_rewrites_the_end_file_when_the_booking_is_extended(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    seen = tmp_path / "seen"
    command = f'cat "$GPU_PORTAL_END_FILE" > {seen}.0; echo "$GPU_PORTAL_END" >> {seen}.0; '
    command += f'while true; do cat "$GPU_PORTAL_END_FILE" > {seen}; sleep 0.05; done'
    portal.book(5, me, _gpu_uuids(agent)[:1], command=command, minutes=30)
    cycle_until(agent, lambda: Path(f"{seen}.0").exists() and Path(seen).exists())
    first_end = portal.desired["bookings"][0]["end"]
    file_end, env_end = Path(f"{seen}.0").read_text().split()
    assert datetime.fromisoformat(file_end) == datetime.fromisoformat(first_end)
    assert datetime.fromisoformat(env_end) == datetime.fromisoformat(first_end)
    later = datetime.fromisoformat(first_end) + timedelta(hours=1)
    portal.desired["bookings"][0]["end"] = later.isoformat()
    portal.desired["generation"] += 1
    cycle_until(
        agent, lambda: datetime.fromisoformat(Path(seen).read_text().strip() or first_end) == later
    )
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: _event(portal, "stopped", 5))


# Each stamp is written whole, then renamed: a reader never sees a file that is still empty.
_TRAP = (
    "trap 'date +%s.%N > {out}.w && mv {out}.w {out}.warned' USR1; "
    "trap 'date +%s.%N > {out}.t && mv {out}.t {out}.term; exit 0' TERM; "
    "while true; do sleep 0.05; done"
)


def test_it_sends_the_warning_signal_the_asked_seconds_before_the_end(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent(grace_s=5.0)
    out = tmp_path / "job"
    portal.book(
        6,
        me,
        _gpu_uuids(agent)[:1],
        command=_TRAP.format(out=out),
        warn_signal="USR1",
        warn_before_s=2,
    )
    end = protocol.utcnow() + timedelta(seconds=4)
    portal.desired["bookings"][0]["end"] = end.isoformat()
    cycle_until(agent, lambda: Path(f"{out}.term").exists(), timeout_s=15)
    warned = float(Path(f"{out}.warned").read_text())
    stopped = float(Path(f"{out}.term").read_text())
    # The warning 2 s before the end (an agent cycle of slack), SIGTERM at the end.
    assert 1.5 <= end.timestamp() - warned <= 2.5, end.timestamp() - warned
    assert -0.2 <= stopped - end.timestamp() <= 1.2, stopped - end.timestamp()


def test_it_warns_a_job_stopped_before_its_end_one_kill_wait_before_sigterm(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent(grace_s=30.0)
    out = tmp_path / "job"
    portal.book(
        7,
        me,
        _gpu_uuids(agent)[:1],
        command=_TRAP.format(out=out),
        warn_signal="USR1",
        warn_before_s=600,
        kill_wait_s=2,
        minutes=60,
    )
    cycle_until(agent, lambda: _event(portal, "started", 7))
    time.sleep(0.3)  # the shell sets its traps
    portal.desired["bookings"].clear()  # preempted
    portal.desired["generation"] += 1
    stopped_at = time.time()
    cycle_until(agent, lambda: _event(portal, "stopped", 7), timeout_s=15)
    warned = float(Path(f"{out}.warned").read_text())
    termed = float(Path(f"{out}.term").read_text())
    assert warned - stopped_at <= 1.0
    assert 1.8 <= termed - warned <= 3.0, termed - warned  # the booking's kill wait, 2 s


def test_it_forms_one_job_across_two_nodes_with_a_real_rendezvous(me, tmp_path, cycle_until):
    """Two agents, each with its own portal's desired state, run the rendezvous script."""
    port = free_port("127.0.0.1")
    agents, portals = [], []
    hostnames = [f"rdv-a-{os.getpid()}", f"rdv-b-{os.getpid()}"]
    try:
        for hostname in hostnames:
            stand_in = StandInPortal()
            stand_in.start()
            backend = SimulatedBackend("2xH100-80GB", hostname, seed=1)
            agent = Agent(
                stand_in.url,
                TOKEN,
                backend,
                hostname=hostname,
                state_dir=tmp_path / hostname,
                push=False,
                min_uid=0,
                grace_s=1.0,
                address="127.0.0.1",
                default_workdir=str(tmp_path),
            )
            agent.start()
            portals.append(stand_in)
            agents.append(agent)
        nodes = [{"hostname": h, "address": "127.0.0.1", "slots": 2} for h in hostnames]
        for rank, (stand_in, agent) in enumerate(zip(portals, agents, strict=True)):
            workdir = tmp_path / f"rank{rank}"
            workdir.mkdir()
            stand_in.book(
                9,
                me,
                _gpu_uuids(agent),
                command=f"{sys.executable} {RENDEZVOUS}",
                nodes=nodes,
                node_rank=rank,
                master_port=port,
                workdir=str(workdir),
            )

        def both_exited():
            for agent in agents:
                agent.handle_one_cycle()
            return all(_event(p, "exited", 9) for p in portals)

        cycle_until(agents[0], both_exited, timeout_s=30)
        for rank, stand_in in enumerate(portals):
            exited = _event(stand_in, "exited", 9)
            assert exited.exit_code == 0, exited.log_tail
            assert exited.log_tail == f"rank {rank} of 2 nodes (4 GPUs) met ranks 0,1\n"
    finally:
        for agent in agents:
            agent.dispatcher.stop_all(0.5, protocol.utcnow())
            agent.backend.close()
        for stand_in in portals:
            stand_in.stop()


@pytest.mark.parametrize("name", typing.get_args(protocol.WarnSignal))
def test_it_knows_every_signal_the_protocol_allows(name):
    assert jobenv.signal_number(name) not in (signal.SIGKILL, signal.SIGSTOP)
