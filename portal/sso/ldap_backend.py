"""LDAP sign-in (django-auth-ldap). Imported only when LDAP_SERVER_URI is set."""

from django_auth_ldap.backend import LDAPBackend

from portal.models import GroupMappingRule
from portal.services.access.sso import memberships_sync


class PortalLDAPBackend(LDAPBackend):
    """django-auth-ldap's bind and user copy, then projects from the user's directory groups."""

    def authenticate_ldap_user(self, ldap_user, password):
        user = super().authenticate_ldap_user(ldap_user, password)
        if user is not None:
            memberships_sync(
                user=user, groups=ldap_user.group_names, source=GroupMappingRule.Source.LDAP
            )
        return user
