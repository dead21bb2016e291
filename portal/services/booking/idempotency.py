"""Submitting a booking at most once per Idempotency-Key.

The key is stored on the booking with the SHA-256 of the canonical request, in the booking's
own transaction, and is unique per owner (constraint portal_booking_idempotency_key_once). A
retry with the same key and request gets the first booking back; the same key with another
request is refused (422). Two requests racing with one key: the second one's insert waits on
the unique index for the first to commit, then fails, and it answers with the first's booking.
A key names one booking for good: use a fresh one (a UUID) for each new booking.
"""

import hashlib
import json
from datetime import UTC, datetime

from django.db import IntegrityError

from portal.errors import ApplicationError, IdempotencyKeyReused, ValidationFailed
from portal.models import Booking
from portal.services.access.audit import SYSTEM, Source
from portal.services.booking.bookings import booking_submit

HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = Booking._meta.get_field("idempotency_key").max_length


def request_digest(fields: dict) -> str:
    """SHA-256 of a validated request: the same request however its JSON was spelled (key
    order, time zones of the datetimes, defaults left out or given)."""

    def canonical(value):
        if isinstance(value, datetime):
            return value.astimezone(UTC).isoformat()
        return value

    text = json.dumps({k: canonical(v) for k, v in fields.items()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def booking_submit_once(
    *, user, now: datetime, key: str, source: Source = SYSTEM, **fields
) -> tuple[Booking, bool]:
    """Submit, or return the booking this key already made; True when it was made now."""
    if not key:
        return booking_submit(user=user, now=now, source=source, **fields), True
    if len(key) > MAX_KEY_LENGTH:
        raise ValidationFailed.field(HEADER, f"at most {MAX_KEY_LENGTH} characters.")
    digest = request_digest(fields)
    earlier = _earlier(user, key, digest)
    if earlier is not None:
        return earlier, False
    try:
        booking = booking_submit(
            user=user,
            now=now,
            source=source,
            idempotency_key=key,
            request_digest=digest,
            **fields,
        )
    except (ApplicationError, IntegrityError):
        # A request with this key won a race: its booking took the key (or the devices).
        earlier = _earlier(user, key, digest)
        if earlier is None:
            raise
        return earlier, False
    return booking, True


def _earlier(user, key: str, digest: str) -> Booking | None:
    booking = Booking.objects.filter(owner=user, idempotency_key=key).first()
    if booking is not None and booking.request_digest != digest:
        raise IdempotencyKeyReused(
            f"The {HEADER} '{key}' was used for booking {booking.pk}, with a different request; "
            "use a new key for a new booking.",
            fields={HEADER: "already used with a different request"},
        )
    return booking
