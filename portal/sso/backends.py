"""Authentication backends: local passwords (switchable) and OpenID Connect."""

import logging

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from portal.models import GroupMappingRule
from portal.services.access.sso import Identity, sso_user_provision

log = logging.getLogger(__name__)


class LocalPasswordBackend(ModelBackend):
    """Django's password check, refused when LOCAL_LOGIN_ENABLED is off.

    It stays installed either way: it also answers permission checks (the admin) and loads the
    signed-in user for every session, whichever way they signed in.
    """

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.LOCAL_LOGIN_ENABLED:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def claim_value(claims: dict, path: str):
    """A claim by name, or by dotted path into nested objects (`realm_access.roles`)."""
    value = claims
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def groups_from_claim(value) -> tuple[str, ...]:
    """The group names in a groups claim: a list of names, or one name (anything else: none)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(item for item in value if isinstance(item, str))
    return ()


def identity_from_claims(claims: dict) -> Identity | None:
    """Who the provider says signed in; None without a usable username claim."""
    username = claim_value(claims, settings.OIDC_USERNAME_CLAIM)
    if not isinstance(username, str) or not username.strip() or len(username) > 150:
        return None

    def text(name: str) -> str:
        value = claims.get(name)
        return value if isinstance(value, str) else ""

    return Identity(
        username=username.strip(),
        email=text("email") if claims.get("email_verified", True) is not False else "",
        first_name=text("given_name"),
        last_name=text("family_name"),
        groups=groups_from_claim(claim_value(claims, settings.OIDC_GROUPS_CLAIM)),
    )


class PortalOIDCBackend(OIDCAuthenticationBackend):
    """OpenID Connect sign-in: the user is matched by username claim (OIDC_USERNAME_CLAIM),
    created on first sign-in, and put in projects by the group mapping rules."""

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        identity = identity_from_claims(claims)
        if identity is None:
            log.warning("OIDC sign-in refused: no %r claim", settings.OIDC_USERNAME_CLAIM)
            return None
        return sso_user_provision(
            identity=identity,
            source=GroupMappingRule.Source.OIDC,
            create=settings.OIDC_CREATE_USER,
        )
