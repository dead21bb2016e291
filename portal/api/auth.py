"""API token authentication: `Authorization: Token <key>`, keys stored hashed."""

from django.utils import timezone
from rest_framework import authentication, exceptions

from portal.models import ApiToken
from portal.models.tokens import hash_token


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


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        raw = authorization_key(request, self.keyword)
        if raw is None:
            return None
        token = ApiToken.objects.select_related("user").filter(key_hash=hash_token(raw)).first()
        if token is None or not token.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        now = timezone.now()
        if token.last_used is None or (now - token.last_used).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword
