"""Signing in: local passwords, OpenID Connect and LDAP (docs/authentication.md)."""
