"""Interactive sessions (JupyterLab, a terminal) that a node runs for a booking's owner.

The node's agent launches the session server as the booking's job, reports where it listens
(`started`), when it accepts connections (`session_ready`) and when it ends (`exited`, `stopped`);
the portal proxies the owner's browser to it (portal/consumers/sessions.py). docs/interactive.md
explains the transport and the security model.
"""

import secrets

from django.db import transaction

from agents.protocol import SESSION_PATH, Event
from portal.errors import ValidationFailed
from portal.models import Booking
from portal.services.realtime import live

Interactive = Booking.Interactive
SessionState = Booking.SessionState


def session_request_check(*, interactive: str | None, command: str) -> str:
    """The interactive kind a submission asks for ("none" when absent), or a 400 naming it."""
    kind = interactive or Interactive.NONE
    if kind not in Interactive.values:
        choices = ", ".join(Interactive.values)
        raise ValidationFailed.field("interactive", f"must be one of {choices}.")
    if kind != Interactive.NONE and command:
        raise ValidationFailed.field(
            "interactive", "an interactive session runs no command: leave command empty."
        )
    return kind


def session_prepare(booking: Booking, *, interactive: str) -> None:
    """Mark an unsaved booking as interactive and give it its session secret."""
    booking.interactive = interactive
    if interactive != Interactive.NONE:
        booking.session_token = secrets.token_urlsafe(32)


def session_path(booking_id: int) -> str:
    """The portal path under which a booking's session is served (the server's base URL)."""
    return SESSION_PATH.format(booking_id=booking_id)


def session_event_apply(*, event: Event, node_hostname: str) -> None:
    """Follow a session's life from the agent's events (inside the events transaction)."""
    rows = Booking.objects.filter(pk=event.booking_id).exclude(interactive=Interactive.NONE)
    if event.kind == "started" and event.session_port is not None:
        changed = rows.update(
            session_state=SessionState.STARTING,
            session_host=event.session_host or "",
            session_port=event.session_port,
            session_detail=f"starting on {node_hostname}",
        )
    elif event.kind == "session_ready":
        changed = rows.filter(session_state=SessionState.STARTING).update(
            session_state=SessionState.RUNNING, session_detail=f"running on {node_hostname}"
        )
    elif event.kind in ("exited", "stopped"):
        changed = _session_ended(rows, event)
    else:
        return
    if changed:
        _broadcast(event.booking_id)


def _session_ended(rows, event: Event) -> int:
    if event.kind == "stopped":
        state, detail = SessionState.STOPPED, event.detail
    elif event.exit_code == 0:
        state, detail = SessionState.STOPPED, "the session server exited"
    else:
        code = "" if event.exit_code is None else f" with code {event.exit_code}"
        state, detail = SessionState.FAILED, f"the session server exited{code}"
        last = _last_line(event.log_tail or event.detail)
        detail += f": {last}" if last else ""
    return rows.update(session_state=state, session_detail=detail[:300])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _broadcast(booking_id: int) -> None:
    def send() -> None:
        booking = Booking.objects.filter(pk=booking_id).only("owner_id", "state").first()
        if booking is not None:
            live.booking_broadcast(
                booking_id=booking_id,
                owner_id=booking.owner_id,
                state=booking.state,
                event="session",
            )

    transaction.on_commit(send, robust=True)
