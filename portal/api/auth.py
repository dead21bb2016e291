"""API token authentication: `Authorization: Token <key>`, keys stored hashed.

A script sends its token with every request, so the token -> user lookup is cached for
TOKEN_CACHE_S seconds. Revocation is immediate all the same: deleting a token, or saving its user
(deactivated, password changed), drops the cached entries at once, in every process (the cache is
the shared Redis in server mode).
"""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver
from django.utils import timezone
from rest_framework import authentication, exceptions, status
from rest_framework.permissions import SAFE_METHODS

from portal.models import ApiToken
from portal.models.tokens import hash_token

LAST_USED_EVERY_S = 60


def authorization_key(request, keyword: str) -> str | None:
    """The key of an `Authorization: <keyword> <key>` header; None when another scheme is used."""
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() != keyword.lower().encode():
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed(f"Invalid token header: expected '{keyword} <key>'.")
    try:
        return header[1].decode()
    except UnicodeError as exc:
        raise exceptions.AuthenticationFailed("Invalid token header.") from exc


def _cache_key(key_hash: str) -> str:
    return f"apitoken:{key_hash}"


def token_user(raw: str) -> tuple | None:
    """(user, token) for a raw API key, from the cache or PostgreSQL; None if unknown or inactive."""
    key_hash = hash_token(raw)
    found = cache.get(_cache_key(key_hash))
    if found is None:
        token = ApiToken.objects.select_related("user").filter(key_hash=key_hash).first()
        if token is None or not token.user.is_active:
            return None
        found = (token.user, token)
        cache.set(_cache_key(key_hash), found, settings.TOKEN_CACHE_S)
    user, token = found
    now = timezone.now()
    if token.last_used is None or (now - token.last_used).total_seconds() > LAST_USED_EVERY_S:
        ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        token.last_used = now
        cache.set(_cache_key(key_hash), (user, token), settings.TOKEN_CACHE_S)
    return user, token


class TokenExpired(exceptions.AuthenticationFailed):
    default_code = "token_expired"
    default_detail = "This token has expired; create a new one."


class TokenReadOnly(exceptions.APIException):
    status_code = status.HTTP_403_FORBIDDEN
    default_code = "token_read_only"
    default_detail = "This token is read-only; use a read-write token to change things."


class TokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Token <key>`; an expired token is 401, a read-only one 403 on writes."""

    keyword = "Token"

    def authenticate(self, request):
        raw = authorization_key(request, self.keyword)
        if raw is None:
            return None
        found = token_user(raw)
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        token = found[1]
        if token.expired(timezone.now()):
            raise TokenExpired()
        if token.scope == ApiToken.Scope.READ and request.method not in SAFE_METHODS:
            raise TokenReadOnly()
        return found

    def authenticate_header(self, request):
        return self.keyword


@receiver(post_save, sender=ApiToken)
@receiver(post_delete, sender=ApiToken)
def _token_changed(sender, instance, **kwargs):
    cache.delete(_cache_key(instance.key_hash))


@receiver(post_save, sender=get_user_model())
def _user_saved(sender, instance, created, **kwargs):
    if not created:
        hashes = ApiToken.objects.filter(user=instance).values_list("key_hash", flat=True)
        cache.delete_many([_cache_key(h) for h in hashes])
