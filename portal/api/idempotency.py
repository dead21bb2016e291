"""Idempotency-Key support for POST /bookings/: a retried request returns the first booking.

The key is remembered per user for a day in the cache (Redis). While the first request with a key
is still running, a second one with the same key gets 409 instead of booking twice.
"""

from contextlib import contextmanager

from django.core.cache import cache

from portal.errors import Conflict, ValidationFailed

TTL_S = 86400
MAX_KEY_LENGTH = 200


def _key(user_id: int, key: str) -> str:
    return f"idem:{user_id}:{key}"


@contextmanager
def once(*, user_id: int, key: str):
    """Yield the booking id an earlier request with this key made, or None (and hold the key)."""
    if not key:
        yield None
        return
    if len(key) > MAX_KEY_LENGTH:
        raise ValidationFailed.field("Idempotency-Key", f"at most {MAX_KEY_LENGTH} characters.")
    earlier = cache.get(_key(user_id, key))
    if isinstance(earlier, int):
        yield earlier
        return
    if not cache.add(_key(user_id, key), "running", timeout=60):
        raise Conflict("A request with this Idempotency-Key is still being processed.")
    try:
        yield None
    except BaseException:
        cache.delete(_key(user_id, key))
        raise


def remember(*, user_id: int, key: str, booking_id: int) -> None:
    if key:
        cache.set(_key(user_id, key), booking_id, timeout=TTL_S)
