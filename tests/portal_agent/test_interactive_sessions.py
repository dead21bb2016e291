"""Interactive sessions, portal side: asking for one, desired state, the agent's events, the proxy's
refusals. (The real JupyterLab through the real proxy: tests/web/test_interactive.py.)"""

from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator, WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from rest_framework.test import APIClient

from agents import protocol
from portal.consumers.sessions import SessionHttpProxy, SessionWebsocketProxy
from portal.models import Booking, MigInstance
from portal.services.booking.selectors import session_target
from tests.conftest import error_of
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, make_active_booking, member
from tests.portal_agent.conftest import AgentClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice(db):
    user = UserFactory(username="alice")
    project = ProjectFactory(slug="vision")
    member(user, project)
    QuotaFactory(project=project, max_gpus=16)
    return user


def _api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _reservation(**fields) -> dict:
    start = timezone.now() - timedelta(seconds=30)
    body = {"mig_profile": "2g.20gb", "start": start.isoformat()}
    body["end"] = (start + timedelta(hours=2)).isoformat()
    return body | fields


def _session_booking(alice, node_a) -> Booking:
    mig = MigInstance.objects.filter(gpu__node=node_a[0], profile="2g.20gb").first()
    booking = make_active_booking([mig], owner=alice, interactive="jupyterlab")
    Booking.objects.filter(pk=booking.pk).update(session_token="tok-" + "x" * 40)
    return Booking.objects.get(pk=booking.pk)


def _event(kind: str, booking_id: int, **fields) -> dict:
    return {"kind": kind, "time": protocol.utcnow().isoformat(), "booking_id": booking_id} | fields


def test_it_books_a_mig_slice_with_jupyterlab_and_never_shows_the_session_secret(alice, node_a):
    response = _api(alice).post("/api/v1/bookings/", _reservation(interactive="jupyterlab"))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["interactive"] == "jupyterlab"
    assert (body["state"], body["session"]["state"]) == ("planned", "waiting")
    assert body["session"]["url"] == ""  # no link until the node says it runs
    booking = Booking.objects.get(pk=body["id"])
    assert len(booking.session_token) >= 40
    assert booking.session_token not in response.content.decode()


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"interactive": "vnc"}, "is not a valid choice"),
        ({"interactive": "jupyterlab", "command": "python train.py"}, "runs no command"),
    ],
)
def test_it_refuses_a_bad_interactive_request_naming_the_field(alice, node_a, fields, reason):
    response = _api(alice).post("/api/v1/bookings/", _reservation(**fields), format="json")
    assert response.status_code == 400
    assert reason in error_of(response)["fields"]["interactive"]
    assert not Booking.objects.exists()


def test_it_sends_the_node_the_session_to_run_with_its_secret(alice, node_a):
    booking = _session_booking(alice, node_a)
    plain = make_active_booking([node_a[0].gpus.get(index=0)], owner=alice)
    desired = AgentClient(node_a[1]).get(protocol.DESIRED_PATH).json()
    rows = {row["booking_id"]: row for row in desired["bookings"]}
    assert rows[booking.pk]["interactive"] == "jupyterlab"
    assert rows[booking.pk]["session_token"] == booking.session_token
    assert rows[plain.pk].get("interactive") is None
    assert rows[plain.pk].get("session_token") is None


def test_it_follows_the_session_from_the_agents_events(alice, node_a):
    booking = _session_booking(alice, node_a)
    agent = AgentClient(node_a[1])
    where = {"session_host": "127.0.0.1", "session_port": 41999, "pid": 4242}
    assert agent.events(_event("started", booking.pk, **where)).status_code == 202
    booking.refresh_from_db()
    assert (booking.session_state, booking.session_port) == ("starting", 41999)
    assert not session_target(user=alice, booking_id=booking.pk).running

    assert agent.events(_event("session_ready", booking.pk, **where)).status_code == 202
    target = session_target(user=alice, booking_id=booking.pk)
    assert target.running and target.upstream == "127.0.0.1:41999"
    page = _api(alice).get(f"/api/v1/bookings/{booking.pk}/").json()["session"]
    assert page["url"] == f"/sessions/{booking.pk}/lab"
    listed = _api(alice).get("/api/v1/bookings/").json()["results"]
    assert [row["session"] for row in listed if row["id"] == booking.pk] == [page]

    # Only the owner: not another user, not an admin.
    assert session_target(user=UserFactory(), booking_id=booking.pk) is None
    assert (
        session_target(user=UserFactory(is_staff=True, is_superuser=True), booking_id=booking.pk)
        is None
    )
    assert session_target(user=AnonymousUser(), booking_id=booking.pk) is None


def test_it_shows_why_a_session_failed_and_keeps_the_booking(alice, node_a):
    booking = _session_booking(alice, node_a)
    agent = AgentClient(node_a[1])
    agent.events(_event("started", booking.pk, session_host="127.0.0.1", session_port=41998))
    tail = "[I] starting\nModuleNotFoundError: No module named 'jupyterlab'\n"
    agent.events(_event("exited", booking.pk, exit_code=1, log_tail=tail))
    booking.refresh_from_db()
    assert booking.state == "active"  # the devices stay booked; only the session failed
    assert booking.session_state == "failed"
    assert booking.session_detail == (
        "the session server exited with code 1: ModuleNotFoundError: No module named 'jupyterlab'"
    )


def test_it_ends_the_session_with_the_booking(alice, node_a):
    booking = _session_booking(alice, node_a)
    Booking.objects.filter(pk=booking.pk).update(
        session_state="running", session_host="127.0.0.1", session_port=41997
    )
    _api(alice).post(f"/api/v1/bookings/{booking.pk}/release/")
    target = session_target(user=alice, booking_id=booking.pk)
    assert not target.running and target.state == "stopped"


# -- the proxy's refusals (no session server needed to refuse) ------------------------------


def _http(user, path: str, method: str = "GET", headers=None):
    async def run():
        communicator = HttpCommunicator(SessionHttpProxy.as_asgi(), method, path, headers=headers)
        communicator.scope["user"] = user
        return await communicator.get_response(timeout=10)

    return async_to_sync(run)()


def _websocket_accepted(user, path: str) -> bool:
    async def run():
        communicator = WebsocketCommunicator(SessionWebsocketProxy.as_asgi(), path)
        communicator.scope["user"] = user
        connected, _ = await communicator.connect(timeout=10)
        await communicator.disconnect()
        return connected

    return async_to_sync(run)()


@pytest.mark.django_db(transaction=True)
def test_it_answers_404_for_anyone_elses_session_or_none_at_all(alice, node_a):
    booking = _session_booking(alice, node_a)
    Booking.objects.filter(pk=booking.pk).update(
        session_state="running", session_host="127.0.0.1", session_port=9
    )
    bob = UserFactory(username="bob")
    for path in (f"/sessions/{booking.pk}/lab", f"/sessions/{booking.pk + 99}/lab"):
        response = _http(bob, path)
        assert response["status"] == 404
        assert b"No such session" in response["body"]
        assert dict(response["headers"])[b"content-security-policy"].startswith(
            b"default-src 'none'"
        )
    ws = f"/sessions/{booking.pk}/api/kernels/k1/channels"
    assert not _websocket_accepted(bob, ws)
    anonymous = _http(AnonymousUser(), f"/sessions/{booking.pk}/lab")
    assert anonymous["status"] == 302
    assert dict(anonymous["headers"])[b"location"].startswith(b"/accounts/login/")


@pytest.mark.django_db(transaction=True)
def test_it_tells_the_owner_a_session_is_starting_or_has_ended(alice, node_a):
    booking = _session_booking(alice, node_a)
    starting = _http(alice, f"/sessions/{booking.pk}/lab")
    assert starting["status"] == 503 and b"Session starting" in starting["body"]
    Booking.objects.filter(pk=booking.pk).update(state="finished", state_detail="released")
    ended = _http(alice, f"/sessions/{booking.pk}/lab")
    assert ended["status"] == 410 and b"Session ended" in ended["body"]
    assert not _websocket_accepted(alice, f"/sessions/{booking.pk}/api/kernels/k1/channels")


def test_it_shows_the_session_on_the_booking_page_its_state_reason_and_link(alice, node_a):
    from django.test import Client

    booking = _session_booking(alice, node_a)
    page = Client()
    page.force_login(alice)
    url = f"/bookings/{booking.pk}/?fragment=booking"
    Booking.objects.filter(pk=booking.pk).update(
        session_state="failed", session_detail="the session server exited with code 1: no kernel"
    )
    failed = page.get(url).content.decode()
    assert "Failed" in failed and "The session server exited with code 1: no kernel" in failed
    assert "session-open" not in failed
    Booking.objects.filter(pk=booking.pk).update(session_state="running", session_port=41000)
    running = page.get(url).content.decode()
    assert f'href="/sessions/{booking.pk}/lab"' in running and "Open JupyterLab" in running


@pytest.mark.django_db(transaction=True)
def test_it_refuses_a_cross_site_request_to_a_session(alice, node_a):
    booking = _session_booking(alice, node_a)
    # Port 9 (discard) answers nothing: a request let through ends in 502, a refused one in 403.
    Booking.objects.filter(pk=booking.pk).update(
        session_state="running", session_host="127.0.0.1", session_port=9
    )
    path = f"/sessions/{booking.pk}/api/kernels"
    host = [(b"host", b"portal.example.org")]
    evil = _http(alice, path, "POST", host + [(b"origin", b"https://evil.example.com")])
    assert evil["status"] == 403
    same = _http(alice, path, "POST", host + [(b"origin", b"https://portal.example.org")])
    assert same["status"] == 502


def test_it_keeps_the_protocols_session_bounds_equal_to_the_columns():
    assert protocol.SESSION_TOKEN_MAX == Booking._meta.get_field("session_token").max_length
    assert protocol.HOSTNAME_MAX == Booking._meta.get_field("session_host").max_length
