"""Reads of bookings for pages, the API and the commands' permission checks (writes live in
`bookings`, `reservations` and `sessions`)."""

from dataclasses import dataclass

from portal.errors import NotAllowed, NotFound
from portal.models import Booking
from portal.services.access import permissions
from portal.services.booking.sessions import Interactive, SessionState, session_path

# Where "Open ..." lands inside the session server, per kind.
_LANDING = {Interactive.JUPYTERLAB: "lab", Interactive.TERMINAL: "lab/workspaces/terminal"}


def visible_bookings(user):
    """Bookings a user may see (permissions.CAN["booking.view"]): own, managed projects', all."""
    match = permissions.visible_filter(
        user, "booking.view", owner_field="owner", project_field="project_id"
    )
    qs = Booking.objects.all()
    return qs if match is None else qs.filter(match)


def booking_get_for_change(*, user, booking_id: int, action: str = "booking.view") -> Booking:
    """The booking if the user may do `action` to it (permissions.CAN); 404 if they may not
    even see it, 403 if they see it but the table does not let them do that."""
    booking = visible_bookings(user).filter(pk=booking_id).first()
    if booking is None:
        raise NotFound(f"No booking {booking_id} among yours.")
    if not permissions.can(user, action, owner_id=booking.owner_id, project_id=booking.project_id):
        verb = action.split(".")[1]
        raise NotAllowed(
            f"Booking {booking_id} is not yours; your role does not let you {verb} it "
            "(see docs/roles.md)."
        )
    return booking


@dataclass(frozen=True)
class SessionTarget:
    """What the proxy needs to reach one running session, or why it cannot."""

    booking_id: int
    running: bool
    state: str
    detail: str
    host: str
    port: int | None
    token: str

    @property
    def upstream(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def session_target(*, user, booking_id: int) -> SessionTarget | None:
    """The session of `user`'s own interactive booking; None for anyone else's or none at all.

    Only the owner: not an admin, not a project colleague (a session runs as its owner).
    """
    if not getattr(user, "is_authenticated", False):
        return None
    booking = (
        Booking.objects.filter(pk=booking_id, owner_id=user.pk)
        .exclude(interactive=Interactive.NONE)
        .only(
            "state",
            "state_detail",
            "session_state",
            "session_detail",
            "session_host",
            "session_port",
            "session_token",
        )
        .first()
    )
    if booking is None:
        return None
    active = booking.state == Booking.State.ACTIVE
    state, detail = booking.session_state, booking.session_detail
    if not active:
        state, detail = SessionState.STOPPED, booking.state_detail or "the booking has ended"
    return SessionTarget(
        booking_id=booking_id,
        running=active and state == SessionState.RUNNING and booking.session_port is not None,
        state=state or SessionState.STARTING,
        detail=detail,
        host=booking.session_host,
        port=booking.session_port,
        token=booking.session_token,
    )


def session_view(booking: Booking) -> dict | None:
    """What the booking page shows about its session: state, sentence, and the link when open."""
    return session_summary(
        booking_id=booking.pk,
        interactive=booking.interactive,
        booking_state=booking.state,
        session_state=booking.session_state,
        session_detail=booking.session_detail,
    )


def session_summary(
    *,
    booking_id: int,
    interactive: str,
    booking_state: str,
    session_state: str,
    session_detail: str,
) -> dict | None:
    """A booking's session as pages and the API show it; None for a booking without one."""
    if interactive == Interactive.NONE:
        return None
    label = Interactive(interactive).label
    state, detail = session_state, session_detail
    if booking_state in (Booking.State.PENDING, Booking.State.PLANNED):
        state, detail = "waiting", f"{label} starts when the booking starts"
    elif booking_state != Booking.State.ACTIVE:
        state, detail = SessionState.STOPPED, "the session ended with the booking"
    elif not state:
        state, detail = SessionState.STARTING, "waiting for the node to launch it"
    url = session_path(booking_id) + _LANDING.get(interactive, "lab")
    return {
        "label": label,
        "state": state,
        "detail": detail,
        "url": url if state == SessionState.RUNNING else "",
    }
