"""Talking to the portal: reconnects, queued events, bad tokens, pushes."""

import subprocess
import threading
import time

import pytest
from websockets.sync.server import serve

from agents import protocol
from agents.backoff import Backoff
from agents.portal import AuthError


def _kinds(portal):
    return [(e.kind, e.booking_id) for e in portal.events()]


def test_it_registers_its_inventory_and_reports_readings(portal, make_agent):
    agent = make_agent("1xH100-80GB,1xA100-80GB:mig=3g.40gb+2g.20gb")
    agent.handle_one_cycle()
    (register,) = [body for _, path, body in portal.received if path == protocol.REGISTER_PATH]
    assert register.hostname == agent.hostname
    assert [g.mig_mode for g in register.gpus] == [False, True]
    assert [m.profile for m in register.gpus[1].mig_instances] == ["3g.40gb", "2g.20gb"]
    (readings,) = [body for _, path, body in portal.received if path == protocol.READINGS_PATH]
    assert len(readings.readings) == 4  # two GPUs and two MIG instances
    assert readings.readings[2].utilization_gpu is None
    assert portal.paths()[:3] == [
        protocol.REGISTER_PATH,
        protocol.DESIRED_PATH,
        protocol.READINGS_PATH,
    ]


def test_it_takes_policy_and_intervals_from_the_portal_unless_overridden(portal, make_agent):
    portal.register_answer.update(enforcement="warn", report_interval_s=7, sync_interval_s=45)
    agent = make_agent(report_interval_s=None, sync_interval_s=None)
    agent.handle_one_cycle()
    assert (agent.policy, agent.report_interval_s, agent.sync_interval_s) == ("warn", 7.0, 45.0)
    overridden = make_agent(policy="kill", report_interval_s=1)
    overridden.handle_one_cycle()
    assert (overridden.policy, overridden.report_interval_s) == ("kill", 1.0)


def test_it_queues_events_while_the_portal_is_down_and_resyncs_when_it_returns(
    portal, make_agent, cycle_until, me
):
    agent = make_agent()
    gpu0 = agent.backend.discover()[0].uuid
    portal.book(1, me, [gpu0], command="sleep 0.3; exit 4")
    cycle_until(agent, lambda: ("started", 1) in _kinds(portal))
    portal.stop()
    cycle_until(agent, lambda: any(e.kind == "exited" for e in agent.events))
    assert ("exited", 1) not in _kinds(portal)  # nowhere to send it yet
    portal.received.clear()
    portal.book(2, me, [gpu0], command="exit 0")  # changed while the agent was away
    portal.start()
    cycle_until(agent, lambda: ("exited", 2) in _kinds(portal), timeout_s=15)
    assert portal.paths()[:2] == [protocol.REGISTER_PATH, protocol.DESIRED_PATH]
    assert _kinds(portal)[0] == ("exited", 1)
    assert next(e for e in portal.events() if e.booking_id == 1).exit_code == 4
    assert not agent.events


def test_it_registers_again_before_posting_anything_when_a_backoff_ends_mid_cycle(
    portal, make_agent
):
    clock = [0.0]
    agent = make_agent(clock=lambda: clock[0])
    agent.handle_one_cycle()
    portal.status_override = 503  # the portal goes away: the agent backs off
    agent.handle_one_cycle()
    portal.status_override = None
    portal.received.clear()
    sample = agent.backend.sample

    def slow_sample():  # the backoff runs out while the agent samples its devices
        clock[0] += 3600
        return sample()

    agent.backend.sample = slow_sample
    agent.handle_one_cycle()
    agent.handle_one_cycle()
    assert portal.paths()[:2] == [protocol.REGISTER_PATH, protocol.DESIRED_PATH]
    assert protocol.READINGS_PATH in portal.paths()


def test_it_bounds_the_event_queue_dropping_the_oldest(portal, make_agent):
    agent = make_agent(max_queued_events=3)
    events = [protocol.Event("exited", protocol.utcnow(), booking_id=i) for i in range(5)]
    agent._queue(events)
    assert [e.booking_id for e in agent.events] == [2, 3, 4]


def test_it_backs_off_exponentially_capped_and_jittered():
    rolls = iter([1.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    backoff = Backoff(base_s=1, cap_s=5, rand=lambda: next(rolls))
    assert [backoff.next_delay() for _ in range(5)] == [1, 2, 4, 2.5, 5]
    backoff.reset()
    assert backoff.next_delay() == 1


def test_it_raises_on_a_refused_token(portal, make_agent):
    agent = make_agent(token="wrong")
    with pytest.raises(AuthError, match="HTTP 401"):
        agent.handle_one_cycle()


def test_it_exits_non_zero_with_a_clear_error_on_a_bad_token(agent_argv):
    result = subprocess.run(agent_argv(token="wrong"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 3
    assert "refused the node token" in result.stderr


def test_it_pulls_desired_state_at_once_when_the_portal_pushes(portal, make_agent, cycle_until, me):
    connected = threading.Event()
    sockets = []

    def handler(ws):
        assert ws.request.headers["Authorization"] == "Bearer node-token-1"
        assert ws.request.path == protocol.WEBSOCKET_PATH
        sockets.append(ws)
        connected.set()
        for _ in ws:  # hold the connection open until the agent closes it
            pass

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        agent = make_agent(
            push=True,
            push_url=f"ws://127.0.0.1:{port}{protocol.WEBSOCKET_PATH}",
            sync_interval_s=3600,
        )
        assert connected.wait(5)
        time.sleep(0.3)  # let the agent's on-connect re-sync request land before counting
        agent.handle_one_cycle()
        pulls = portal.paths().count(protocol.DESIRED_PATH)
        agent.handle_one_cycle()
        assert portal.paths().count(protocol.DESIRED_PATH) == pulls  # not due for an hour
        portal.book(9, me, [agent.backend.discover()[0].uuid], command="exit 0")
        sockets[0].send(protocol.dumps(protocol.PushMessage("desired_changed", 99)).decode())
        cycle_until(agent, lambda: ("started", 9) in _kinds(portal))
        assert portal.paths().count(protocol.DESIRED_PATH) == pulls + 1
        agent.close()
        server.shutdown()


def test_it_refuses_to_start_on_a_bad_spec_or_user_map(tmp_path, caplog):
    from agents.__main__ import main

    base = ["--portal", "http://127.0.0.1:9", "--token", "t", "--state-dir", str(tmp_path)]
    assert main([*base, "--simulate", "8xH100"]) == 2
    assert "bad group '8xH100'" in caplog.text
    user_map = tmp_path / "users.json"
    user_map.write_text('["ann"]')
    assert main([*base, "--simulate", "1xH100-80GB", "--user-map", str(user_map)]) == 2
    assert "expected a JSON object of portal user -> Unix user" in caplog.text


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        ("--address", "10.9.9.9 --nproc-per-node=999", "must be an IP address or a host name"),
        ("--hostname", "evil slots=99", "must be a host name"),
    ],
)
def test_it_refuses_to_start_with_a_name_or_address_that_is_no_host(
    tmp_path, capsys, option, value, said
):
    from agents.__main__ import main

    base = ["--portal", "http://127.0.0.1:9", "--token", "t", "--state-dir", str(tmp_path)]
    with pytest.raises(SystemExit) as stopped:
        main([*base, "--simulate", "1xH100-80GB", option, value])
    assert stopped.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error:" in x]
    assert f"argument {option}: {value!r} {said}" in line


def test_it_reconnects_the_push_websocket_and_asks_for_a_resync():
    from agents.push import PushListener

    connects, pushes = [], []

    def handler(ws):
        ws.send('{"type": "desired_changed", "generation": 5}')
        ws.close()  # the portal restarts: the agent must come back on its own

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"ws://127.0.0.1:{server.socket.getsockname()[1]}{protocol.WEBSOCKET_PATH}"
        listener = PushListener(
            url, {}, pushes.append, lambda: connects.append(1), Backoff(base_s=0.05, cap_s=0.2)
        )
        listener.start()
        deadline = time.monotonic() + 5
        while len(connects) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        listener.stop()
        server.shutdown()
    assert len(connects) >= 3  # every reconnect asks the agent to register and pull again
    assert pushes[:2] == [5, 5]


def test_it_warns_only_once_the_portal_has_failed_for_a_while(portal, make_agent, caplog):
    clock = [0.0]
    agent = make_agent(clock=lambda: clock[0])
    agent.handle_one_cycle()
    portal.status_override = 503
    caplog.set_level("INFO", logger="agents.agent")
    for _ in range(3):  # a blip: a portal restarting, or stopping before its agents
        clock[0] += 3
        agent.handle_one_cycle()
    assert [r.levelname for r in caplog.records if "portal request failed" in r.message] == [
        "INFO"
    ] * 3
    caplog.clear()
    clock[0] += 5  # failing for 11 s now
    agent.handle_one_cycle()
    (warning,) = [r for r in caplog.records if "portal request failed" in r.message]
    assert warning.levelname == "WARNING" and "for 11 s" in warning.message
