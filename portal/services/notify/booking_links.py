"""One-click actions from a message: signed, single-use, expiring links bound to one booking.

A token signs (booking, action, the booking's version, a nonce) with the site's key and the time.
It opens a confirmation page (a GET changes nothing, so a mail scanner following it does no harm);
the page's one button POSTs, and only then is the action done, through the booking services. The
nonce is recorded on use, so a link works once. The version (state and length) changes when the
booking does, so a link made before a release or an extension is refused as stale.
"""

import secrets
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction

from portal.errors import ApplicationError
from portal.models import ActionUse, Booking
from portal.services.access.audit import Source
from portal.services.booking import bookings
from portal.services.booking.events import caused_by
from portal.services.notify import reclaim

_SALT = "portal.booking-action"
EXTEND_BY_S = 3600

ACTIONS = {
    "extend": "Extend by an hour",
    "release": "Release now",
    "keep": "Keep it",
    "cancel": "Cancel the booking",
}

PROBLEMS = {
    "invalid": "This link is not valid. It may have been cut short when copied.",
    "expired": "This link has expired. Open the booking in the portal to act on it.",
    "used": "This link was already used. Each link works once.",
    "changed": "The booking changed since this link was sent, so the link no longer applies.",
    "gone": "This booking no longer exists.",
}


@dataclass(frozen=True)
class LinkCheck:
    """What a token asks for, and the reason it cannot be done (problem), if any."""

    booking: Booking | None
    action: str
    nonce: str
    problem: str = ""

    @property
    def problem_text(self) -> str:
        return PROBLEMS.get(self.problem, "")


def booking_version(booking: Booking) -> str:
    """Changes whenever the booking's state or length does."""
    return f"{booking.state}:{booking.duration_s}"


def action_token(*, booking: Booking, action: str) -> str:
    """A signed token for `action` on `booking` as it is now."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    payload = {
        "b": booking.pk,
        "a": action,
        "v": booking_version(booking),
        "n": secrets.token_urlsafe(12),
    }
    return signing.TimestampSigner(salt=_SALT).sign_object(payload, compress=True)


def action_url(*, booking: Booking, action: str) -> str:
    return f"{settings.SITE_URL}/actions/{action_token(booking=booking, action=action)}/"


def action_check(*, token: str) -> LinkCheck:
    """Read a token: the booking and action, or why it cannot be used. Reads only."""
    signer = signing.TimestampSigner(salt=_SALT)
    try:
        data = signer.unsign_object(token, max_age=settings.NOTIFY_ACTION_TTL_S)
    except signing.SignatureExpired:
        return LinkCheck(None, "", "", "expired")
    except (signing.BadSignature, ValueError):
        return LinkCheck(None, "", "", "invalid")
    if not isinstance(data, dict) or data.get("a") not in ACTIONS:
        return LinkCheck(None, "", "", "invalid")
    action, nonce = data["a"], str(data.get("n", ""))
    booking = Booking.objects.select_related("owner", "project").filter(pk=data.get("b")).first()
    if booking is None:
        return LinkCheck(None, action, nonce, "gone")
    if ActionUse.objects.filter(nonce=nonce).exists():
        return LinkCheck(booking, action, nonce, "used")
    if booking_version(booking) != data.get("v"):
        return LinkCheck(booking, action, nonce, "changed")
    return LinkCheck(booking, action, nonce)


def action_perform(*, token: str, now: datetime, source: Source) -> LinkCheck:
    """Do what a token asks, once, as the booking's owner; the check says why not, if not.
    `source` is how it came (via link or slack, with the client's address) for the audit log.

    The nonce is recorded before the action so two clicks racing do it once; if the booking
    services refuse (no capacity to extend, quota), the use is dropped and the message shown.
    """
    check = action_check(token=token)
    if check.problem:
        return check
    try:
        with transaction.atomic():
            use = ActionUse.objects.create(
                nonce=check.nonce, booking=check.booking, action=check.action, used_at=now
            )
    except IntegrityError:
        return LinkCheck(check.booking, check.action, check.nonce, "used")
    try:
        _do(check.booking, check.action, now, source)
    except ApplicationError:
        use.delete()
        raise
    check.booking.refresh_from_db()
    return check


def _do(booking: Booking, action: str, now: datetime, source: Source) -> None:
    owner, pk = booking.owner, booking.pk
    with caused_by("link"):
        _do_as_owner(owner, pk, action, now, source)


def _do_as_owner(owner, pk: int, action: str, now: datetime, source: Source) -> None:
    if action == "extend":
        bookings.booking_extend(user=owner, booking_id=pk, now=now, by_s=EXTEND_BY_S, source=source)
    elif action == "release":
        bookings.booking_release(user=owner, booking_id=pk, now=now, source=source)
    elif action == "cancel":
        bookings.booking_cancel(user=owner, booking_id=pk, now=now, source=source)
    else:
        reclaim.idle_keep(booking_id=pk, now=now)
