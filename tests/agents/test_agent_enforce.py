"""Enforcement: foreign and unbooked processes are reported once, warned or killed by policy."""

import os
import pty

from agents.procfs import read_stat


def _found(portal, kind):
    return [e for e in portal.events() if e.kind == kind]


def _gone(proc):
    return proc.poll() is not None


def test_it_reports_a_foreign_process_once(portal, make_agent, spawn, cycle_until, me, as_root):
    agent = make_agent(user_map={"alice": me})
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, "alice", [gpu0])
    intruder = spawn(["sleep", "60"], cuda_devices=gpu0, user="nobody")
    cycle_until(agent, lambda: _found(portal, "foreign_process"))
    for _ in range(5):
        agent.handle_one_cycle()
    (event,) = _found(portal, "foreign_process")
    assert (event.pid, event.user, event.device_uuid) == (intruder.pid, "nobody", gpu0)
    assert (event.booking_id, event.action) == (1, "report")
    assert "booked by alice" in event.detail
    assert intruder.poll() is None  # report only: left running


def test_it_leaves_the_booking_owners_own_processes_alone(portal, make_agent, spawn, as_root):
    agent = make_agent(user_map={"alice": "nobody"})
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, "alice", [gpu0])
    spawn(["sleep", "60"], cuda_devices=gpu0, user="nobody")
    for _ in range(5):
        agent.handle_one_cycle()
    assert portal.events() == []


def test_it_kills_a_foreign_process_under_policy_kill(
    portal, make_agent, spawn, cycle_until, me, as_root
):
    portal.register_answer["enforcement"] = "kill"
    agent = make_agent(user_map={"alice": me})
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, "alice", [gpu0])
    intruder = spawn(["sleep", "60"], cuda_devices=gpu0, user="nobody")
    cycle_until(agent, lambda: _gone(intruder))
    (event,) = _found(portal, "foreign_process")
    assert event.action == "kill"
    assert intruder.returncode == -15  # SIGTERM was enough


def test_it_sigkills_a_foreign_process_that_ignores_sigterm(
    portal, make_agent, spawn, cycle_until, me, as_root
):
    agent = make_agent(policy="kill", grace_s=0.5)
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, me, [gpu0])
    intruder = spawn(
        ["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"], cuda_devices=gpu0, user="nobody"
    )
    cycle_until(agent, lambda: _gone(intruder))
    assert intruder.returncode == -9


def test_it_reports_unbooked_processes_once_and_only_after_the_first_pull(
    portal, make_agent, spawn, cycle_until
):
    agent = make_agent()
    gpu1 = agent.backend.discover()[1].uuid
    squatter = spawn(["sleep", "60"], cuda_devices=gpu1)
    portal.status_override = 503  # no desired state yet: every device would look unbooked
    for _ in range(3):
        agent.handle_one_cycle()
    assert list(agent.events) == []
    portal.status_override = None
    cycle_until(agent, lambda: _found(portal, "unbooked_process"))
    for _ in range(5):
        agent.handle_one_cycle()
    (event,) = _found(portal, "unbooked_process")
    assert (event.pid, event.booking_id, event.device_uuid) == (squatter.pid, None, gpu1)
    assert "no booking holds" in event.detail


def test_it_covers_mig_instances_of_a_booked_whole_gpu(portal, make_agent, spawn, as_root):
    agent = make_agent("1xA100-80GB:mig=3g.40gb+3g.40gb", user_map={"alice": "nobody"})
    gpu = agent.backend.discover()[0]
    portal.book(1, "alice", [gpu.uuid])
    spawn(["sleep", "60"], cuda_devices=gpu.mig_instances[1].uuid, user="nobody")
    for _ in range(3):
        agent.handle_one_cycle()
    assert portal.events() == []


def test_it_warns_on_the_controlling_terminal_under_policy_warn(
    portal, make_agent, spawn, cycle_until, as_root
):
    agent = make_agent(policy="warn")
    gpu0 = agent.backend.discover()[0].uuid
    master, slave = pty.openpty()
    intruder = spawn(["sleep", "60"], cuda_devices=gpu0, user="nobody", stdin=slave)
    os.close(slave)
    cycle_until(agent, lambda: _found(portal, "unbooked_process"))
    (event,) = _found(portal, "unbooked_process")
    assert event.action == "warn"
    assert "warned on /dev/pts/" in event.detail
    assert b"[gpu-portal]" in os.read(master, 4096)
    assert read_stat(intruder.pid) is not None  # warned, not killed
    os.close(master)
