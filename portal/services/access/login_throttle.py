"""Failed-login throttle: counted per client address and per username, in Django's cache.

The client address is the one the site's trusted proxies report (settings.TRUSTED_PROXY_COUNT;
0 means no proxy: REMOTE_ADDR, and X-Forwarded-For is ignored), so a client cannot pick its own
bucket by sending a header. Over the limit, no password is checked at all.
"""

import hashlib
import time

from django.conf import settings
from django.core.cache import cache


def client_address(request) -> str:
    """REMOTE_ADDR, or with N trusted proxies the Nth address from the right of X-Forwarded-For."""
    remote = request.META.get("REMOTE_ADDR", "")
    count = settings.TRUSTED_PROXY_COUNT
    xff = request.META.get("HTTP_X_FORWARDED_FOR")
    if count <= 0 or not xff:
        return remote
    addrs = xff.split(",")
    return addrs[-min(count, len(addrs))].strip() or remote


def _keys(request, username: str) -> list[str]:
    window = settings.LOGIN_FAILURE_WINDOW_S
    bucket = int(time.time() // window)
    user = hashlib.sha256((username or "").strip().lower().encode()).hexdigest()[:32]
    return [
        f"login-fail:addr:{client_address(request)}:{bucket}",
        f"login-fail:user:{user}:{bucket}",
    ]


def wait_s(request, username: str) -> int:
    """Seconds until a login may be tried again for this address or username; 0 when it may now."""
    limit = settings.LOGIN_FAILURE_LIMIT
    if any((cache.get(key) or 0) >= limit for key in _keys(request, username)):
        window = settings.LOGIN_FAILURE_WINDOW_S
        return max(1, int(window - time.time() % window))
    return 0


def record_failure(request, username: str) -> None:
    """Count one wrong password against the address and the username."""
    for key in _keys(request, username):
        cache.add(key, 0, timeout=settings.LOGIN_FAILURE_WINDOW_S)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=settings.LOGIN_FAILURE_WINDOW_S)


def message(wait: int) -> str:
    return f"Too many login attempts; try again in {wait} seconds."
