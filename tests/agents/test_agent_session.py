"""Interactive sessions on the node: a real JupyterLab launched as the booking's job."""

import json
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import pytest

from agents.procfs import read_cuda_devices
from agents.session import session_listening

CHECKOUT = f"{zlib.crc32(str(Path(__file__).resolve()).encode()):08x}"
TOKEN = "per-session-secret-0123456789"


def _event(portal, kind, booking_id):
    return next((e for e in portal.events() if e.kind == kind and e.booking_id == booking_id), None)


def _get(url: str, token: str | None):
    headers = {"Authorization": f"token {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.timeout(120)
def test_it_runs_jupyterlab_on_the_booked_devices_behind_its_token_and_stops_it_with_the_booking(
    portal, make_agent, cycle_until, me
):
    agent = make_agent(spec="1xA100-80GB:mig=3g.40gb+2x2g.20gb")
    mig = agent.backend.discover()[0].mig_instances[0].uuid
    portal.book(5, me, [mig], interactive="jupyterlab", session_token=TOKEN)

    cycle_until(agent, lambda: _event(portal, "session_ready", 5) is not None, timeout_s=60)
    started = _event(portal, "started", 5)
    assert (started.session_host, started.session_port) == (
        "127.0.0.1",
        agent.dispatcher.jobs[5].session_port,
    )
    assert started.user == me
    assert read_cuda_devices(started.pid) == {mig}
    # The secret is in the environment, never on the command line that `ps` shows everyone.
    assert TOKEN.encode() not in Path(f"/proc/{started.pid}/cmdline").read_bytes()

    status = f"http://127.0.0.1:{started.session_port}/sessions/5/api/status"
    assert _get(status, None)[0] == 403  # Jupyter's own token check refuses a bare connection
    assert _get(status, "guessed-token")[0] == 403
    code, body = _get(status, TOKEN)
    assert code == 200 and "kernels" in json.loads(body)

    portal.desired["bookings"].clear()  # released in the portal
    portal.desired["generation"] += 1
    cycle_until(agent, lambda: _event(portal, "stopped", 5) is not None, timeout_s=30)
    assert not Path(f"/proc/{started.pid}").exists()
    assert not session_listening("127.0.0.1", started.session_port)


def test_it_reports_a_session_that_cannot_start_with_its_reason(
    portal, make_agent, cycle_until, me
):
    agent = make_agent(session_python="/nonexistent/python3")
    gpu = agent.backend.discover()[0].uuid
    portal.book(6, me, [gpu], interactive="jupyterlab", session_token=TOKEN)
    cycle_until(agent, lambda: _event(portal, "exited", 6) is not None)
    exited = _event(portal, "exited", 6)
    # Launched through a confinement wrapper it fails there, else it is not launched at all:
    # either way the reason names the missing program.
    assert exited.exit_code != 0
    assert "/nonexistent/python3" in f"{exited.detail} {exited.log_tail}"
    assert _event(portal, "session_ready", 6) is None


@pytest.mark.timeout(120)
def test_it_opens_a_terminal_session_on_its_own_workspace(
    portal, make_agent, cycle_until, me, tmp_path
):
    agent = make_agent()
    gpu = agent.backend.discover()[0].uuid
    portal.book(7, me, [gpu], interactive="terminal", session_token=TOKEN)
    cycle_until(agent, lambda: _event(portal, "session_ready", 7) is not None, timeout_s=60)
    port = _event(portal, "started", 7).session_port
    # The page the portal links to (lab/workspaces/terminal) restores this layout: one terminal.
    code, body = _get(f"http://127.0.0.1:{port}/sessions/7/lab/api/workspaces/terminal", TOKEN)
    assert code == 200
    layout = json.loads(body)["data"]
    assert layout["layout-restorer:data"]["main"]["dock"]["widgets"] == ["terminal:1"]
    portal.desired["bookings"].clear()
    portal.desired["generation"] += 1
    cycle_until(agent, lambda: _event(portal, "stopped", 7) is not None, timeout_s=30)
    assert not (tmp_path / "state" / "sessions" / "booking-7").exists()  # its layout went too


@pytest.mark.timeout(120)
def test_it_starts_jupyterlab_without_asking_about_news(portal, make_agent, cycle_until, me):
    agent = make_agent()
    gpu = agent.backend.discover()[0].uuid
    portal.book(8, me, [gpu], interactive="jupyterlab", session_token=TOKEN)
    cycle_until(agent, lambda: _event(portal, "session_ready", 8) is not None, timeout_s=60)
    port = _event(portal, "started", 8).session_port
    # JupyterLab asks "Would you like to get notified about official Jupyter news?" while the
    # setting is "none" (Ask), whatever --LabApp.news_url says.
    plugin = "@jupyterlab/apputils-extension:notification"
    code, body = _get(f"http://127.0.0.1:{port}/sessions/8/lab/api/settings/{plugin}", TOKEN)
    assert code == 200
    answer = json.loads(body)
    defaults = {k: v.get("default") for k, v in answer["schema"]["properties"].items()}
    composite = defaults | answer["settings"]  # what the page reads (user settings over defaults)
    assert composite["fetchNews"] == "false" and composite["checkForUpdates"] is False
    portal.desired["bookings"].clear()
    portal.desired["generation"] += 1
    cycle_until(agent, lambda: _event(portal, "stopped", 8) is not None, timeout_s=30)
