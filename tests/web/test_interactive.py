"""Interactive sessions end to end: a real agent runs a real JupyterLab, opened through the portal.

alice books a MIG slice with JupyterLab in the browser; the agent (simulated MIG GPU, in this
process) launches JupyterLab as her job; the booking page offers "Open JupyterLab"; a cell prints
CUDA_VISIBLE_DEVICES and shows the booked slice; bob cannot reach her session by URL or websocket;
releasing the booking stops the server and the proxied URL says the session ended.
"""

import re
import threading
import zlib
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from agents.agent import Agent
from agents.session import session_listening
from agents.simulate import SimulatedBackend
from portal.models import Booking, MigInstance
from portal.services.fleet.nodes import node_token_issue
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, member
from tests.web.conftest import ARTIFACTS, sign_in

pytestmark = pytest.mark.browser
PASSWORD = "pw-secret-123"
# The checkout is part of the hostname, so side-by-side suites never share simulated devices.
HOSTNAME = f"sim-jlab-{zlib.crc32(str(Path(__file__).resolve()).encode()):08x}"


@pytest.fixture
def site(transactional_db):
    project = ProjectFactory(slug="vision", name="Vision lab")
    QuotaFactory(project=project, max_gpus=16)
    for name in ("alice", "bob"):
        member(UserFactory(username=name), project)
    return project


@pytest.fixture
def node_agent(site, asgi_server, tmp_path):
    """A real agent on a simulated MIG GPU, cycling in a thread against the live portal."""
    import getpass

    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    agent = Agent(
        asgi_server,
        node_token_issue(hostname=HOSTNAME),
        SimulatedBackend("1xA100-80GB:mig=3g.40gb+2x2g.20gb", HOSTNAME, seed=3),
        hostname=HOSTNAME,
        state_dir=tmp_path / "agent",
        user_map={"alice": getpass.getuser(), "bob": getpass.getuser()},
        report_interval_s=1.0,
        sync_interval_s=0.5,
        grace_s=5.0,
        push=False,
        min_uid=0,  # sessions run as whoever runs the suite, root included
        confine="off",
        # Notebooks land here, not in the home of whoever runs the tests.
        session_dir=str(notebooks),
    )
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(timeout=30)
        for job in list(agent.dispatcher.jobs.values()):
            if job.popen is not None and job.popen.poll() is None:
                job.popen.kill()
                job.popen.wait()


def _wait(condition, timeout_s: float, what: str, page=None):
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if page is not None:
            page.wait_for_timeout(250)
        else:
            time.sleep(0.25)


def _fetch_status(page, url: str) -> int:
    return page.evaluate("u => fetch(u, {redirect: 'manual'}).then(r => r.status)", url)


def _websocket_opens(page, url: str) -> bool:
    script = """u => new Promise(done => {
        const ws = new WebSocket(u);
        ws.onopen = () => { ws.close(); done(true); };
        ws.onerror = () => done(false);
        setTimeout(() => done(false), 8000);
    })"""
    return page.evaluate(script, url)


@pytest.mark.timeout(300)
def test_it_opens_jupyterlab_on_the_booked_mig_slice_for_its_owner_only(
    site, node_agent, asgi_server, chromium, browser_page
):
    _wait(lambda: MigInstance.objects.filter(gpu__node__hostname=HOSTNAME).count() == 3, 30, "node")
    page = browser_page
    page.set_default_timeout(60_000)
    sign_in(page, asgi_server, "alice", PASSWORD)

    # alice books a MIG slice from now, with JupyterLab.
    page.goto(f"{asgi_server}/book/")
    page.check("input[name=kind][value=mig]")
    page.select_option("#id_mig_profile", "2g.20gb")
    page.check("#id_when_1")
    now = timezone.now()
    page.fill("#id_start", now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))
    page.fill("#id_end", (now + timedelta(hours=2)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M"))
    page.select_option("#id_interactive", "jupyterlab")
    page.click("button:has-text('Submit booking')")
    booking = Booking.objects.get()
    page.wait_for_url(f"{asgi_server}/bookings/{booking.pk}/")
    slice_uuid = booking.allocations.get().device_uuid
    assert booking.interactive == "jupyterlab" and booking.state == "active"

    # While the node starts it, the page says so; then it offers "Open JupyterLab".
    state = page.text_content("#session").strip()
    assert "Starting" in state or "Open JupyterLab" in state
    page.screenshot(path=str(ARTIFACTS / "interactive-starting.png"))
    page.wait_for_selector("#session-open", timeout=90_000)
    page.screenshot(path=str(ARTIFACTS / "interactive-booking.png"), full_page=True)
    assert page.text_content("#session-open").strip() == "Open JupyterLab"

    # A real click lands in JupyterLab, served through the portal's own address.
    with page.context.expect_page() as opened:
        page.click("#session-open")
    lab = opened.value
    lab.set_default_timeout(90_000)
    lab.wait_for_load_state()
    assert lab.url.startswith(f"{asgi_server}/sessions/{booking.pk}/lab")
    lab.wait_for_selector(".jp-LauncherCard", timeout=120_000)

    # A notebook on the Python kernel prints the booked slice's id.
    lab.click(".jp-LauncherCard[data-category='Notebook']")
    cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
    cell.wait_for()
    lab.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    cell.click()
    lab.keyboard.type('import os; print(os.environ["CUDA_VISIBLE_DEVICES"])')
    output = lab.locator(".jp-OutputArea-output").first
    for _ in range(4):
        # A request sent while JupyterLab still settles its kernel connection can be lost
        # (JupyterLab's own behaviour): run the cell again until it answers.
        cell.click()
        lab.keyboard.press("Control+Enter")
        try:
            output.wait_for(timeout=30_000)
            break
        except PlaywrightTimeout:
            continue
    lab.screenshot(path=str(ARTIFACTS / "interactive-jupyterlab.png"))
    assert output.text_content().strip() == slice_uuid

    # bob, signed in, cannot open her session by URL or websocket: 404, as for no session at all.
    kernels = lab.evaluate(
        "u => fetch(u).then(r => r.json())", f"{asgi_server}/sessions/{booking.pk}/api/kernels"
    )
    kernel_ws = f"ws://{asgi_server.split('://')[1]}/sessions/{booking.pk}/api/kernels/"
    kernel_ws += f"{kernels[0]['id']}/channels"
    assert _websocket_opens(lab, kernel_ws)  # hers opens
    bob_context = chromium.new_context()
    bob = bob_context.new_page()
    sign_in(bob, asgi_server, "bob", PASSWORD)
    for path in (f"/sessions/{booking.pk}/lab", f"/sessions/{booking.pk}/api/kernels"):
        assert bob.goto(f"{asgi_server}{path}").status == 404
    bob.goto(f"{asgi_server}/")  # scripts from a portal page (the 404 page allows none)
    assert _fetch_status(bob, f"{asgi_server}/sessions/{booking.pk + 1}/lab") == 404
    assert not _websocket_opens(bob, kernel_ws)
    bob_context.close()

    # Releasing the booking stops the server on the node; the proxied URL says it ended.
    job = node_agent.dispatcher.jobs[booking.pk]
    pid, port = job.pid, job.session_port
    page.click("button:has-text('Release')")
    page.wait_for_url(re.compile(rf".*/bookings/{booking.pk}/?$"))
    _wait(lambda: not Path(f"/proc/{pid}").exists(), 60, "the session server to stop", page)
    assert not session_listening("127.0.0.1", port)
    ended = page.goto(f"{asgi_server}/sessions/{booking.pk}/lab")
    assert ended.status == 410
    assert "Session ended" in page.text_content("h1")
    _wait(
        lambda: Booking.objects.get(pk=booking.pk).session_state == "stopped", 30, "the stop event"
    )


@pytest.mark.timeout(240)
def test_it_opens_a_terminal_session_in_the_browser(
    site, node_agent, asgi_server, browser_page, tmp_path
):
    from portal.services.booking.bookings import booking_submit
    from tests.web.conftest import in_thread

    _wait(lambda: MigInstance.objects.filter(gpu__node__hostname=HOSTNAME).count() == 3, 30, "node")
    alice = site.memberships.get(user__username="alice").user
    now = timezone.now()
    booking = in_thread(
        booking_submit,
        user=alice,
        now=now,
        mig_profile="3g.40gb",
        start=now - timedelta(seconds=30),
        end=now + timedelta(hours=1),
        interactive="terminal",
    )
    page = browser_page
    page.set_default_timeout(60_000)
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/bookings/{booking.pk}/")
    page.wait_for_selector("#session-open", timeout=90_000)
    assert page.text_content("#session-open").strip() == "Open Terminal"
    with page.context.expect_page() as opened:
        page.click("#session-open")
    lab = opened.value
    try:
        lab.wait_for_selector(".jp-Terminal", timeout=60_000)
    finally:
        lab.screenshot(path=str(ARTIFACTS / "interactive-terminal.png"))
    terminals = f"{asgi_server}/sessions/{booking.pk}/api/terminals"
    _wait(
        lambda: lab.evaluate("u => fetch(u).then(r => r.json())", terminals) != [],
        60,
        "the terminal to start",
        lab,
    )
    # Typed into the terminal, through the proxied websocket, on the booked slice.
    out = tmp_path / "cvd.txt"
    lab.click(".jp-Terminal")
    lab.keyboard.type(f"echo $CUDA_VISIBLE_DEVICES > {out}\n")
    _wait(lambda: out.exists() and out.read_text().strip(), 30, "the terminal's output", lab)
    assert out.read_text().strip() == booking.allocations.get().device_uuid
