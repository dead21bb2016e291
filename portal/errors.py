"""The portal's one error hierarchy. The API maps each to {"error": {"code", "message", "fields"}}."""


class ApplicationError(Exception):
    """A refusal a user can act on: a status, a stable code, a sentence and the fields at fault."""

    status = 400
    code = "invalid"

    def __init__(
        self, message: str, *, fields: dict[str, str] | None = None, extra: dict | None = None
    ):
        super().__init__(message)
        self.message = message
        self.fields = fields or {}
        self.extra = extra or {}


class ValidationFailed(ApplicationError):
    status = 400
    code = "invalid"

    @classmethod
    def field(cls, name: str, reason: str) -> "ValidationFailed":
        return cls(f"{name}: {reason}", fields={name: reason})


class NotAllowed(ApplicationError):
    status = 403
    code = "forbidden"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class NoCapacity(Conflict):
    code = "no_capacity"


class QuotaExceeded(Conflict):
    code = "quota"


class InvalidState(Conflict):
    code = "invalid_state"


class IdempotencyKeyReused(ApplicationError):
    """An Idempotency-Key sent again with a different request body."""

    status = 422
    code = "idempotency_key_reused"


class Busy(ApplicationError):
    """Locks could not be had in time; the client should retry after a short wait."""

    status = 503
    code = "busy"
    retry_after_s = 2


class TooManyAttempts(ApplicationError):
    """Too many failed logins from this address or for this username; retry after a wait."""

    status = 429
    code = "throttled"

    def __init__(self, message: str, *, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s
