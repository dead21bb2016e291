"""API tokens: create (the key is returned once and only its hash kept) and revoke, audited."""

from datetime import datetime

from django.db import transaction

from portal.errors import NotFound, ValidationFailed
from portal.models import ApiToken
from portal.models.tokens import hash_token, new_token
from portal.services.access import permissions
from portal.services.access.audit import SYSTEM, Source, audit_record, snapshot

TOKEN_FIELDS = ["user_id", "name", "prefix", "scope", "expires_at", "created_by_id"]


def token_create(
    *,
    user,
    now: datetime,
    name: str = "",
    scope: str = ApiToken.Scope.READ_WRITE,
    expires_at: datetime | None = None,
    created_by=None,
    source: Source = SYSTEM,
) -> tuple[str, ApiToken]:
    """A new token for `user`: (the key, shown once; the stored row)."""
    if scope not in ApiToken.Scope.values:
        raise ValidationFailed.field("scope", f"must be one of {', '.join(ApiToken.Scope.values)}.")
    if expires_at is not None and expires_at <= now:
        raise ValidationFailed.field("expires_at", "must be in the future.")
    name = name.strip()
    if len(name) > 100:
        raise ValidationFailed.field("name", "at most 100 characters.")
    raw = new_token("gp")
    token = ApiToken(
        user=user,
        name=name,
        key_hash=hash_token(raw),
        prefix=raw[:10],
        scope=scope,
        expires_at=expires_at,
        created_by=created_by or user,
    )
    with transaction.atomic():
        token.save()
        audit_record(
            action="token.create",
            actor=created_by or user,
            source=source,
            target=token,
            after=snapshot(token, TOKEN_FIELDS),
        )
    return raw, token


def token_revoke(*, actor, token_id: int, source: Source = SYSTEM) -> ApiToken:
    """Revoke (delete) a token: its owner may, and whoever the roles table lets revoke any."""
    token = ApiToken.objects.filter(pk=token_id).first()
    if token is None or not (
        token.user_id == actor.pk or permissions.can(actor, "token.revoke_any")
    ):
        raise NotFound(f"No token {token_id} among yours.")
    before = snapshot(token, TOKEN_FIELDS)
    with transaction.atomic():
        token.delete()
        audit_record(
            action="token.revoke",
            actor=actor,
            source=source,
            target_type="apitoken",
            target_id=token_id,
            before=before,
        )
    return token
