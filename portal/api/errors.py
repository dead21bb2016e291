"""One error shape for the whole API: {"error": {"code", "message", "fields"}}."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from portal.errors import ApplicationError, Busy
from portal.services import metrics
from portal.services.locking import is_contention


def _flatten(detail, prefix: str = "") -> dict[str, str]:
    """DRF nests errors per field (and per list index); flatten to {"field.sub": "reason"}."""
    if isinstance(detail, dict):
        out: dict[str, str] = {}
        for key, value in detail.items():
            out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(detail, list) and any(isinstance(v, dict | list) for v in detail):
        out = {}
        for index, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}.{index}" if prefix else str(index)))
        return out
    reason = " ".join(str(v) for v in detail) if isinstance(detail, list) else str(detail)
    return {prefix or "non_field_errors": reason}


def error_body(code: str, message: str, fields: dict | None = None, **extra) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}, **extra}}


def exception_handler(exc, context):
    """Map ApplicationError and DRF/Django exceptions to the one error shape."""
    if isinstance(exc, ApplicationError):
        response = Response(
            error_body(exc.code, exc.message, exc.fields, **exc.extra), status=exc.status
        )
        if getattr(exc, "retry_after_s", None):
            response["Retry-After"] = str(exc.retry_after_s)
        return response
    if is_contention(exc):
        # Every write is one transaction, so nothing was written: say "busy, retry" (not 500).
        exc = Busy("The booking system is busy; try again in a few seconds.")
        metrics.counter_add("lock_timeouts")
        response = Response(error_body(exc.code, exc.message), status=exc.status)
        response["Retry-After"] = str(exc.retry_after_s)
        return response
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        message = "; ".join(f"{k}: {v}" for k, v in fields.items())
        response.data = error_body("invalid", message, fields)
    else:
        code = getattr(exc, "default_code", "error")
        response.data = error_body(code, str(getattr(exc, "detail", exc)))
    return response
