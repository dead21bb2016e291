"""Logins and failed logins, from Django's auth signals: the login page, /admin/, the API's
token exchange, and any authentication backend (single sign-on included) that sends them."""

from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver

from portal.services.access.audit import SYSTEM, audit_record, source_of


@receiver(user_logged_in)
def _logged_in(sender, request, user, **kwargs):
    source = source_of(request) if request is not None else SYSTEM
    backend = getattr(user, "backend", "") or ""
    audit_record(action="login", actor=user, source=source, after={"backend": backend})


@receiver(user_login_failed)
def _login_failed(sender, credentials, request=None, **kwargs):
    source = source_of(request) if request is not None else SYSTEM
    # Django has already masked anything secret in `credentials`; only the name is kept.
    name = str(credentials.get("username", ""))[:150]
    audit_record(action="login.failed", actor_name=name, source=source, after={"username": name})
