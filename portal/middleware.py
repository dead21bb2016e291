"""A dependency that is down (PostgreSQL, Redis) answers 503 with Retry-After, never a 500.

The request wrote nothing that committed: every command is one transaction, and the cache and the
channel layer hold no truth. So the honest answer is "busy, retry", in the API's one error shape
for /api/ and as a short plain page elsewhere; the next request after the outage works again.
"""

import logging

import redis
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse, JsonResponse

from portal.api.errors import error_body

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
# OperationalError covers a refused or lost PostgreSQL connection and lock timeouts alike.
_DOWN = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OperationalError,
    InterfaceError,
)
_PAGE = (
    "<!doctype html><title>Busy</title><h1>The portal is busy</h1>"
    "<p>A service it depends on is not answering. Retry in a few seconds.</p>"
)


class DependencyDownMiddleware:
    """Turn a view's PostgreSQL or Redis connection failure into 503 + Retry-After."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exc):
        if not isinstance(exc, _DOWN):
            return None
        log.warning("dependency down during %s %s: %s", request.method, request.path, exc)
        if request.path.startswith("/api/"):
            message = "A service the portal depends on is not answering; retry in a few seconds."
            response = JsonResponse(error_body("busy", message), status=503)
        else:
            response = HttpResponse(_PAGE, status=503, content_type="text/html; charset=utf-8")
        response["Retry-After"] = str(RETRY_AFTER_S)
        return response
