"""Dispatch: launching booking commands, stopping them, and re-adopting them after a restart."""

import contextlib
import os
import signal
import subprocess
import time
import zlib
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from agents import confine, dispatch, protocol
from agents.procfs import is_alive, read_cuda_devices, read_stat
from agents.simulate import SimulatedBackend

# Two checkouts' suites on one machine must not share simulated devices (their UUIDs come from
# the hostname): the checkout's path is part of every fixed hostname here.
CHECKOUT = f"{zlib.crc32(str(Path(__file__).resolve()).encode()):08x}"


def _gpu_uuids(agent):
    return [gpu.uuid for gpu in agent.backend.discover()]


def _kinds(portal):
    # Output events come whenever a running job's log grew: timing, not the lifecycle.
    return [(e.kind, e.booking_id) for e in portal.events() if e.kind != "output"]


def _outputs(portal, booking_id):
    return [
        e.log_tail for e in portal.events() if e.kind == "output" and e.booking_id == booking_id
    ]


def _event(portal, kind, booking_id):
    return next(e for e in portal.events() if e.kind == kind and e.booking_id == booking_id)


def test_it_launches_a_command_and_reports_its_exit_code_and_log_tail(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    gpu0, gpu1 = _gpu_uuids(agent)
    portal.book(
        1, me, [gpu0, gpu1], command="sh -c 'echo hi; echo cvd=$CUDA_VISIBLE_DEVICES; exit 3'"
    )
    cycle_until(agent, lambda: ("exited", 1) in _kinds(portal))
    assert _kinds(portal) == [("started", 1), ("exited", 1)], [e.detail for e in portal.events()]
    exited = _event(portal, "exited", 1)
    assert exited.exit_code == 3
    assert exited.log_tail == f"hi\ncvd={gpu0},{gpu1}\n"
    for _ in range(3):
        agent.handle_one_cycle()
    assert _kinds(portal) == [("started", 1), ("exited", 1)]  # never relaunched


def test_it_gives_an_array_task_its_array_and_task_ids(portal, make_agent, cycle_until, me):
    agent = make_agent()
    gpu0, _ = _gpu_uuids(agent)
    show = "sh -c 'echo job=$GPU_PORTAL_ARRAY_JOB_ID task=$GPU_PORTAL_ARRAY_TASK_ID'"
    portal.book(7, me, [gpu0], command=show, array_job_id=5, array_task_id=2)
    portal.book(8, me, [gpu0], command=show)
    cycle_until(agent, lambda: {("exited", 7), ("exited", 8)} <= set(_kinds(portal)))
    assert _event(portal, "exited", 7).log_tail == "job=5 task=2\n"
    assert _event(portal, "exited", 8).log_tail == "job= task=\n"  # not a task: unset


def test_it_reports_a_running_jobs_output_as_it_grows(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    gpu = _gpu_uuids(agent)[0]
    go = tmp_path / "go"
    # Prints a line, waits for the test's signal, prints a second one, then runs on.
    command = f"echo step 1; while [ ! -e {go} ]; do sleep 0.05; done; echo step 2; sleep 30"
    portal.book(5, me, [gpu], command=command)
    cycle_until(agent, lambda: _outputs(portal, 5))
    assert _outputs(portal, 5) == ["step 1\n"]
    for _ in range(3):
        agent.handle_one_cycle()
    assert _outputs(portal, 5) == ["step 1\n"]  # nothing new written: nothing sent again
    go.touch()
    cycle_until(agent, lambda: len(_outputs(portal, 5)) == 2)
    assert _outputs(portal, 5)[-1] == "step 1\nstep 2\n"
    assert ("exited", 5) not in _kinds(portal)  # all of it while the job still runs
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: ("stopped", 5) in _kinds(portal))


def test_it_reports_only_the_last_bytes_of_a_long_output(portal, make_agent, cycle_until, me):
    agent = make_agent()
    gpu = _gpu_uuids(agent)[0]
    portal.book(6, me, [gpu], command="seq 1 5000; echo last line; sleep 30")
    cycle_until(agent, lambda: any("last line" in t for t in _outputs(portal, 6)))
    tail = _outputs(portal, 6)[-1]
    assert len(tail.encode()) == dispatch.LOG_TAIL_BYTES
    assert tail.endswith("4999\n5000\nlast line\n")
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: ("stopped", 6) in _kinds(portal))


def test_it_keeps_only_the_latest_output_of_a_job_while_the_portal_is_away(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    gpu = _gpu_uuids(agent)[0]
    portal.book(7, me, [gpu], command="i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done")
    cycle_until(agent, lambda: _outputs(portal, 7))
    agent._offline_until = float("inf")  # the portal is unreachable: events queue up
    for _ in range(20):
        agent.handle_one_cycle()
        time.sleep(0.02)
    queued = [e for e in agent.events if e.kind == "output"]
    assert len(queued) == 1
    agent._offline_until = None
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: ("stopped", 7) in _kinds(portal))


def test_it_runs_the_command_as_the_mapped_unix_user(portal, make_agent, cycle_until, as_root):
    agent = make_agent(user_map={"ann": "nobody"})
    gpu0 = _gpu_uuids(agent)[0]
    portal.book(2, "ann", [gpu0], command="sleep 30")
    cycle_until(agent, lambda: ("started", 2) in _kinds(portal))
    started = _event(portal, "started", 2)
    assert started.user == "nobody"
    assert os.stat(f"/proc/{started.pid}").st_uid == 65534
    assert read_cuda_devices(started.pid) == {gpu0}
    assert read_stat(started.pid).pgid == started.pid  # its own session and process group
    assert "node-token" not in open(f"/proc/{started.pid}/environ", "rb").read().decode()
    portal.desired["bookings"].clear()
    cycle_until(agent, lambda: ("stopped", 2) in _kinds(portal))


def test_it_refuses_to_run_a_job_as_root_or_a_system_account(portal, make_agent, cycle_until):
    agent = make_agent(min_uid=1000, user_map={"mallory": "root", "svc": "daemon"})
    gpu = _gpu_uuids(agent)[0]
    portal.book(21, "mallory", [gpu], command="touch /tmp/owned-by-root")
    portal.book(22, "svc", [gpu], command="true")
    cycle_until(agent, lambda: {("exited", 21), ("exited", 22)} <= set(_kinds(portal)))
    for booking_id, user in ((21, "root"), (22, "daemon")):
        event = _event(portal, "exited", booking_id)
        assert f"Unix user {user!r} has uid" in event.detail
        assert "below the minimum uid 1000" in event.detail
    assert ("started", 21) not in _kinds(portal) and not agent.dispatcher.jobs


def test_it_reports_an_unknown_unix_user_instead_of_crashing(portal, make_agent, cycle_until):
    agent = make_agent()
    portal.book(3, "no-such-user-xyz", _gpu_uuids(agent)[:1], command="true")
    cycle_until(agent, lambda: ("exited", 3) in _kinds(portal))
    exited = _event(portal, "exited", 3)
    assert exited.exit_code is None
    assert "'no-such-user-xyz'" in exited.detail and "does not exist" in exited.detail
    assert ("started", 3) not in _kinds(portal)


def test_it_stops_a_cancelled_booking_with_sigterm_then_sigkill(
    portal, make_agent, cycle_until, me
):
    agent = make_agent(grace_s=1.0)
    script = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.1; done"
    portal.book(4, me, _gpu_uuids(agent)[:1], command=script)
    cycle_until(agent, lambda: ("started", 4) in _kinds(portal))
    pid = _event(portal, "started", 4).pid
    time.sleep(0.2)
    portal.desired["bookings"].clear()
    cancelled_at = time.monotonic()
    cycle_until(agent, lambda: ("stopped", 4) in _kinds(portal))
    assert time.monotonic() - cancelled_at >= 1.0  # TERM was ignored for the grace period
    stopped = _event(portal, "stopped", 4)
    assert stopped.exit_code == -signal.SIGKILL
    assert "got TERM" in stopped.log_tail
    assert "no longer active" in stopped.detail
    assert read_stat(pid) is None or read_stat(pid).state == "Z"


def test_it_readopts_running_work_after_a_restart(portal, make_agent, cycle_until, me):
    first = make_agent()
    portal.book(5, me, _gpu_uuids(first)[:1], command="sleep 1.5; echo done")
    cycle_until(first, lambda: ("started", 5) in _kinds(portal))
    started = _event(portal, "started", 5)
    first.close()  # the agent goes away; its work must not

    second = make_agent()
    for _ in range(3):
        second.handle_one_cycle()
    assert is_alive(started.pid, read_stat(started.pid).start_ticks)
    assert second.dispatcher.jobs[5].pid == started.pid
    assert _kinds(portal).count(("started", 5)) == 1  # not relaunched
    cycle_until(second, lambda: ("exited", 5) in _kinds(portal))
    exited = _event(portal, "exited", 5)
    # Not its child any more: the exit code is the one the job's launch script wrote.
    assert (exited.exit_code, exited.interrupted) == (0, None)
    assert exited.log_tail == "done\n"
    assert "re-adopted" in exited.detail


def test_it_reports_the_exit_code_of_a_job_that_ended_while_no_agent_ran(
    portal, make_agent, cycle_until, me
):
    first = make_agent()
    portal.book(25, me, _gpu_uuids(first)[:1], command="sleep 0.5; echo bye; exit 3")
    cycle_until(first, lambda: ("started", 25) in _kinds(portal))
    job = first.dispatcher.jobs[25]
    first.close()  # the job runs on, and ends while no agent runs
    _until_gone(job.pid)

    second = make_agent()
    second.handle_one_cycle()
    exited = _event(portal, "exited", 25)
    assert (exited.exit_code, exited.interrupted) == (3, None)
    assert "while no agent watched it" in exited.detail and exited.log_tail == "bye\n"


def test_it_reports_a_job_that_ended_unwatched_with_no_status_as_such(
    portal, make_agent, cycle_until, me
):
    """Its launch script killed with it (a node's OOM killer, a reboot): no exit status at all,
    which the next agent must not report as a plain exit."""
    first = make_agent()
    portal.book(26, me, _gpu_uuids(first)[:1], command="sleep 30")
    cycle_until(first, lambda: ("started", 26) in _kinds(portal))
    job = first.dispatcher.jobs[26]
    first.close()
    os.killpg(job.pgid, signal.SIGKILL)
    _until_gone(job.pid)

    second = make_agent()
    second.handle_one_cycle()
    exited = _event(portal, "exited", 26)
    assert (exited.exit_code, exited.interrupted) == (None, "unwatched")
    assert exited.detail == f"ended unwatched: {dispatch.UNWATCHED}"


def test_it_launches_a_requeued_bookings_next_run_on_the_same_node(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    gpu = _gpu_uuids(agent)[:1]
    portal.book(27, me, gpu, command="echo run $GPU_PORTAL_RESTART_COUNT")
    cycle_until(agent, lambda: ("exited", 27) in _kinds(portal))
    agent.close()
    # The portal requeued it and started it again on the same device before the next pull.
    portal.desired["bookings"][0]["restart_count"] = 1
    portal.desired["generation"] += 1
    again = make_agent()  # from the state file: run 0 of booking 27 is done
    cycle_until(again, lambda: _kinds(portal).count(("exited", 27)) == 2)
    # The output file gets each run's lines in turn.
    assert [e.log_tail for e in portal.events() if e.kind == "exited"] == [
        "run 0\n",
        "run 0\nrun 1\n",
    ]
    for _ in range(3):
        again.handle_one_cycle()
    assert _kinds(portal).count(("started", 27)) == 2  # run 1 once, too


def _until_gone(pid: int, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while (stat := read_stat(pid)) is not None and stat.state != "Z":
        assert time.monotonic() < deadline, f"pid {pid} still runs"
        time.sleep(0.05)


def test_it_stops_its_jobs_on_exit_when_asked_and_the_next_agent_reports_them(
    portal, make_agent, cycle_until, me
):
    first = make_agent(stop_jobs_on_exit_s=2.0)
    portal.book(15, me, _gpu_uuids(first)[:1], command="trap '' TERM; sleep 30 & sleep 30")
    cycle_until(first, lambda: ("started", 15) in _kinds(portal))
    group = first.dispatcher.jobs[15].pgid
    started = time.monotonic()
    portal.status_override = 503  # the portal went first (as `manage.py up` stops it)
    first.close()  # one job group ignores SIGTERM: SIGKILL follows after 2 s
    assert 1.5 < time.monotonic() - started < 10
    assert _group_members(group) == []
    assert _kinds(portal) == [("started", 15)]
    portal.status_override = None
    second = make_agent()
    cycle_until(second, lambda: ("stopped", 15) in _kinds(portal))
    stopped = _event(portal, "stopped", 15)
    # Killed by the agent's stop, not ended by itself: never a plain exit.
    assert (stopped.interrupted, stopped.detail) == (
        "agent_stopped",
        f"stopped: {dispatch.AGENT_STOPPED}",
    )
    assert ("exited", 15) not in _kinds(portal)


def test_it_reports_the_jobs_it_stops_on_exit_itself_while_the_portal_answers(
    portal, make_agent, cycle_until, me
):
    first = make_agent(stop_jobs_on_exit_s=2.0)
    portal.book(16, me, _gpu_uuids(first)[:1], command="sleep 30")
    cycle_until(first, lambda: ("started", 16) in _kinds(portal))
    first.close()
    stopped = _event(portal, "stopped", 16)
    assert stopped.interrupted == "agent_stopped" and stopped.exit_code == -signal.SIGTERM
    second = make_agent()
    for _ in range(3):
        second.handle_one_cycle()
    assert _kinds(portal) == [("started", 16), ("stopped", 16)]  # told once, not again


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_it_refuses_a_stop_on_exit_grace_that_is_not_seconds(value, capsys):
    from agents.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--portal", "http://127.0.0.1:9", "--token", "t", "--stop-jobs-on-exit", value])
    assert exited.value.code == 2
    assert (
        f"--stop-jobs-on-exit: {value!r} is not a number of seconds >= 0" in capsys.readouterr().err
    )


def _group_members(pgid: int) -> list[int]:
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    return [pid for pid in pids if (s := read_stat(pid)) and s.state != "Z" and s.pgid == pgid]


def test_it_stops_readopted_work_when_its_booking_is_cancelled(portal, make_agent, cycle_until, me):
    first = make_agent()
    portal.book(6, me, _gpu_uuids(first)[:1], command="sleep 30")
    cycle_until(first, lambda: ("started", 6) in _kinds(portal))
    first.close()
    second = make_agent()
    second.handle_one_cycle()
    portal.desired["bookings"].clear()
    cycle_until(second, lambda: ("stopped", 6) in _kinds(portal))
    assert _kinds(portal) == [("started", 6), ("stopped", 6)]


def test_it_stops_work_whose_booking_ended_even_while_the_portal_is_down(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    portal.book(7, me, _gpu_uuids(agent)[:1], command="sleep 30", minutes=0.03)
    cycle_until(agent, lambda: ("started", 7) in _kinds(portal))
    pid = _event(portal, "started", 7).pid
    portal.stop()
    cycle_until(agent, lambda: 7 not in agent.dispatcher.jobs, timeout_s=15)
    assert read_stat(pid) is None or read_stat(pid).state == "Z"
    assert [e.kind for e in agent.events] == ["stopped"]


def test_it_follows_an_extended_booking_instead_of_stopping_at_the_old_end(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    portal.book(8, me, _gpu_uuids(agent)[:1], command="sleep 30", minutes=0.03)
    cycle_until(agent, lambda: ("started", 8) in _kinds(portal))
    booking = portal.desired["bookings"][0]
    booking["end"] = (datetime.fromisoformat(booking["end"]) + timedelta(hours=1)).isoformat()
    deadline = time.monotonic() + 3  # well past the original end
    while time.monotonic() < deadline:
        agent.handle_one_cycle()
        time.sleep(0.1)
    assert _kinds(portal) == [("started", 8)]
    assert 8 in agent.dispatcher.jobs


def test_it_readopts_work_across_a_real_agent_process_restart(portal, agent_argv, me):
    hostname = f"restart-node-{CHECKOUT}"
    uuid = SimulatedBackend("1xH100-80GB", hostname).discover()[0].uuid
    portal.book(9, me, [uuid], command="sleep 30")
    args = agent_argv("--hostname", hostname, "--interval", "0.2", "--sync-interval", "0.2")
    first = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: ("started", 9) in _kinds(portal))
        pid = _event(portal, "started", 9).pid
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=10) == 0
        assert read_stat(pid).state != "Z"  # the job outlived its agent
        second = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        _wait(lambda: portal.paths().count(protocol.DESIRED_PATH) >= 6)
        assert _kinds(portal) == [("started", 9)]
        portal.desired["bookings"].clear()
        _wait(lambda: ("stopped", 9) in _kinds(portal))
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=10) == 0
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert read_stat(pid) is None or read_stat(pid).state == "Z"


def test_it_relaunches_work_on_the_new_devices_when_its_booking_moved_while_the_agent_was_dead(
    portal, agent_argv, me
):
    hostname = f"moved-node-{CHECKOUT}"
    old, new = (gpu.uuid for gpu in SimulatedBackend("2xH100-80GB", hostname).discover())
    portal.book(11, me, [old], command="sleep 30")
    args = agent_argv(
        "--hostname", hostname, "--simulate", "2xH100-80GB", "--interval", "0.2",
        "--sync-interval", "0.2",
    )  # fmt: skip
    first = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    second = None
    try:
        _wait(lambda: ("started", 11) in _kinds(portal))
        stale = _event(portal, "started", 11).pid
        first.kill()  # the node's agent dies mid-job; the portal moves the booking meanwhile
        first.wait(timeout=10)
        portal.desired["bookings"][0]["device_uuids"] = [new]
        portal.desired["generation"] += 1
        second = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        _wait(lambda: _kinds(portal).count(("started", 11)) == 2)
        assert _kinds(portal) == [("started", 11), ("stopped", 11), ("started", 11)]
        assert "moved" in _event(portal, "stopped", 11).detail
        relaunched = [e for e in portal.events() if e.kind == "started"][-1].pid
        assert read_cuda_devices(relaunched) == {new}
        assert read_stat(stale) is None or read_stat(stale).state == "Z"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
        for event in portal.events():
            if event.kind == "started":
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(event.pid, signal.SIGKILL)
        home = confine.CGROUP_V1_DEVICES / "gpu-portal" / hostname
        for group in home.glob("booking-*"):
            confine.release(f"cgroup:{group}")  # the agents were killed: nobody else will
        with contextlib.suppress(OSError):
            home.rmdir()


def _wait(condition, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)
