import hashlib
import secrets

from django.conf import settings
from django.db import models


def hash_token(raw: str) -> str:
    """Tokens are long random strings, so one sha256 is enough to store them safely."""
    return hashlib.sha256(raw.encode()).hexdigest()


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(32)}"


class ApiToken(models.Model):
    """A user's API token for scripts. Only its hash is stored; the key is shown once.

    A read-only token may only read (GET, HEAD, OPTIONS); a token past its expiry is refused.
    """

    class Scope(models.TextChoices):
        READ = "read", "Read only"
        READ_WRITE = "read-write", "Read and write"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to tell tokens apart.")
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.READ_WRITE)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Who created it (the user, or an admin on their behalf).",
    )

    class Meta:
        ordering = ["-created", "id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    def expired(self, now) -> bool:
        return self.expires_at is not None and self.expires_at <= now
