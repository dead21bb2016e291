"""Dispatch: launching booking commands, stopping them, and re-adopting them after a restart."""

import os
import signal
import time

from agents.procfs import is_alive, read_cuda_devices, read_stat


def _gpu_uuids(agent):
    return [gpu.uuid for gpu in agent.backend.discover()]


def _kinds(portal):
    return [(e.kind, e.booking_id) for e in portal.events()]


def _event(portal, kind, booking_id):
    return next(e for e in portal.events() if e.kind == kind and e.booking_id == booking_id)


def test_it_launches_a_command_and_reports_its_exit_code_and_log_tail(
    portal, make_agent, cycle_until
):
    agent = make_agent()
    gpu0, gpu1 = _gpu_uuids(agent)
    portal.book(
        1, "root", [gpu0, gpu1], command="sh -c 'echo hi; echo cvd=$CUDA_VISIBLE_DEVICES; exit 3'"
    )
    cycle_until(agent, lambda: ("exited", 1) in _kinds(portal))
    assert _kinds(portal) == [("started", 1), ("exited", 1)], [e.detail for e in portal.events()]
    exited = _event(portal, "exited", 1)
    assert exited.exit_code == 3
    assert exited.log_tail == f"hi\ncvd={gpu0},{gpu1}\n"
    for _ in range(3):
        agent.handle_one_cycle()
    assert _kinds(portal) == [("started", 1), ("exited", 1)]  # never relaunched


def test_it_runs_the_command_as_the_mapped_unix_user(portal, make_agent, cycle_until):
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


def test_it_reports_an_unknown_unix_user_instead_of_crashing(portal, make_agent, cycle_until):
    agent = make_agent()
    portal.book(3, "no-such-user-xyz", _gpu_uuids(agent)[:1], command="true")
    cycle_until(agent, lambda: ("exited", 3) in _kinds(portal))
    exited = _event(portal, "exited", 3)
    assert exited.exit_code is None
    assert "'no-such-user-xyz'" in exited.detail and "does not exist" in exited.detail
    assert ("started", 3) not in _kinds(portal)


def test_it_stops_a_cancelled_booking_with_sigterm_then_sigkill(portal, make_agent, cycle_until):
    agent = make_agent(grace_s=1.0)
    script = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.1; done"
    portal.book(4, "root", _gpu_uuids(agent)[:1], command=script)
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


def test_it_readopts_running_work_after_a_restart(portal, make_agent, cycle_until):
    first = make_agent()
    portal.book(5, "root", _gpu_uuids(first)[:1], command="sleep 1.5; echo done")
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
    assert exited.exit_code is None  # not our child any more: its exit code is unknowable
    assert exited.log_tail == "done\n"
    assert "re-adopted" in exited.detail


def test_it_stops_readopted_work_when_its_booking_is_cancelled(portal, make_agent, cycle_until):
    first = make_agent()
    portal.book(6, "root", _gpu_uuids(first)[:1], command="sleep 30")
    cycle_until(first, lambda: ("started", 6) in _kinds(portal))
    first.close()
    second = make_agent()
    second.handle_one_cycle()
    portal.desired["bookings"].clear()
    cycle_until(second, lambda: ("stopped", 6) in _kinds(portal))
    assert _kinds(portal) == [("started", 6), ("stopped", 6)]


def test_it_stops_work_whose_booking_ended_even_while_the_portal_is_down(
    portal, make_agent, cycle_until
):
    agent = make_agent()
    portal.book(7, "root", _gpu_uuids(agent)[:1], command="sleep 30", minutes=0.03)
    cycle_until(agent, lambda: ("started", 7) in _kinds(portal))
    pid = _event(portal, "started", 7).pid
    portal.stop()
    cycle_until(agent, lambda: 7 not in agent.dispatcher.jobs, timeout_s=15)
    assert read_stat(pid) is None or read_stat(pid).state == "Z"
    assert [e.kind for e in agent.events] == ["stopped"]
