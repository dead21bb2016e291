"""LDAP sign-in through ldap3 (pure Python). Imported only when LDAP_SERVER_URI is set.

The portal searches for the user's entry (as LDAP_BIND_DN, or anonymously), binds as that entry
with the password given to check it, reads the user's groups, and hands what it found to the same
provisioning as OpenID Connect (portal.services.access.sso).
"""

import logging

import ldap3
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from ldap3.core.exceptions import LDAPException
from ldap3.utils.conv import escape_filter_chars

from portal.models import GroupMappingRule
from portal.services.access.sso import Identity, sso_user_provision

log = logging.getLogger(__name__)

# Which attribute of a group entry names its members, and what it holds (the DN or the uid).
_MEMBER_ATTRIBUTE = {
    "groupOfNames": ("member", "dn"),
    "groupOfUniqueNames": ("uniqueMember", "dn"),
    "posixGroup": ("memberUid", "username"),
}


def _connection(user: str | None, password: str | None) -> ldap3.Connection:
    server = ldap3.Server(settings.LDAP_SERVER_URI, connect_timeout=settings.LDAP_TIMEOUT_S)
    connection = ldap3.Connection(
        server,
        user=user or None,
        password=password or None,
        receive_timeout=settings.LDAP_TIMEOUT_S,
        raise_exceptions=False,
    )
    connection.open()
    if settings.LDAP_START_TLS:
        connection.start_tls()
    return connection


def _first(entry: dict, name: str) -> str:
    value = entry.get(name) or ""
    if isinstance(value, list):
        value = value[0] if value else ""
    return value if isinstance(value, str) else ""


def ldap_identity(username: str, password: str) -> Identity | None:
    """Who `username` is in the directory when `password` is theirs; None otherwise."""
    search = _connection(settings.LDAP_BIND_DN, settings.LDAP_BIND_PASSWORD)
    try:
        if not search.bind():
            log.warning(
                "LDAP: the search bind as %r failed: %s", settings.LDAP_BIND_DN, search.result
            )
            return None
        user_filter = settings.LDAP_USER_SEARCH_FILTER % {"user": escape_filter_chars(username)}
        search.search(
            settings.LDAP_USER_SEARCH_BASE,
            user_filter,
            attributes=["givenName", "sn", "mail"],
        )
        if len(search.response or []) == 0 or len(search.entries) != 1:
            return None
        entry = search.entries[0]
        dn = entry.entry_dn
        attributes = entry.entry_attributes_as_dict
        checked = _connection(dn, password)
        try:
            if not password or not checked.bind():
                return None
        finally:
            checked.unbind()
        attribute, holds = _MEMBER_ATTRIBUTE[settings.LDAP_GROUP_TYPE]
        member = escape_filter_chars(dn if holds == "dn" else username)
        search.search(
            settings.LDAP_GROUP_SEARCH_BASE,
            f"(&(objectClass={settings.LDAP_GROUP_TYPE})({attribute}={member}))",
            attributes=["cn"],
        )
        groups = tuple(sorted({_first(g.entry_attributes_as_dict, "cn") for g in search.entries}))
    finally:
        search.unbind()
    return Identity(
        username=username,
        email=_first(attributes, "mail"),
        first_name=_first(attributes, "givenName"),
        last_name=_first(attributes, "sn"),
        groups=tuple(group for group in groups if group),
    )


class PortalLDAPBackend(ModelBackend):
    """Directory passwords: the user is created at first sign-in, then follows the directory's
    names and groups (through the group mapping rules) at every sign-in."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not username or not password or len(username) > 150:
            return None
        try:
            identity = ldap_identity(username, password)
        except LDAPException as error:
            log.warning("LDAP sign-in of %r failed: %s", username, error)
            return None
        if identity is None:
            return None
        user = sso_user_provision(identity=identity, source=GroupMappingRule.Source.LDAP)
        return user if self.user_can_authenticate(user) else None
