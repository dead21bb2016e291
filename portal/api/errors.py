"""One error shape for the whole API: {"error": {"code", "message", "fields"}}."""

import logging
import re

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DataError, IntegrityError
from django.db.models import ProtectedError, RestrictedError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from portal.errors import ApplicationError, Busy
from portal.services.core import counters
from portal.services.core.locking import is_contention

log = logging.getLogger(__name__)

# PostgreSQL names the columns of a violated key in the error's detail: "Key (hostname)=(…)".
_KEY_COLUMNS = re.compile(r"Key \((?P<columns>[^)]*)\)=")
_CONFLICT_REASONS = {
    "23505": "already taken",  # unique_violation
    "23503": "refers to a row that does not exist",  # foreign_key_violation
    "23502": "is required",  # not_null_violation
}


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
        counters.counter_add("lock_timeouts")
        response = Response(error_body(exc.code, exc.message), status=exc.status)
        response["Retry-After"] = str(exc.retry_after_s)
        return response
    database = _database_error(exc)
    if database is not None:
        set_rollback()
        return database
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


def _database_error(exc) -> Response | None:
    """A refusal of the database that no service turned into an ApplicationError: a delete that
    would lose history is 409 `protected`, a value its column cannot hold 400 `invalid`, any
    other integrity violation 409 `conflict`. Never an HTML 500; logged, as a check is missing."""
    if isinstance(exc, ProtectedError | RestrictedError):
        return Response(error_body("protected", str(exc.args[0])), status=409)
    if not isinstance(exc, DataError | IntegrityError):
        return None
    log.warning("the database refused a request: %s", exc)
    diag = getattr(exc.__cause__, "diag", None)
    lines = str(exc).strip().splitlines()
    primary = getattr(diag, "message_primary", None) or (lines[0] if lines else "refused")
    if isinstance(exc, DataError):
        return Response(
            error_body("invalid", f"A value does not fit its field: {primary}."), status=400
        )
    constraint = getattr(diag, "constraint_name", None)
    message = f"The request conflicts with the stored data: {constraint or primary}."
    return Response(error_body("conflict", message, _conflict_fields(exc, diag)), status=409)


def _conflict_fields(exc, diag) -> dict[str, str]:
    reason = _CONFLICT_REASONS.get(getattr(exc.__cause__, "sqlstate", None) or "")
    reason = reason or "conflicts with the stored data"
    if getattr(diag, "column_name", None):
        return {diag.column_name: reason}
    key = _KEY_COLUMNS.search(getattr(diag, "message_detail", None) or "")
    if key is None:
        return {}
    return {column.strip(): reason for column in key.group("columns").split(",")}
