"""Sign-in pages: the login page (password form and/or provider button) and the OIDC redirects."""

import logging

import requests
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import Http404
from django.urls import reverse
from mozilla_django_oidc import views as oidc_views

from portal.web.forms import ThrottledAuthenticationForm

log = logging.getLogger(__name__)


class LoginView(auth_views.LoginView):
    """The password form (local accounts and LDAP) and a "Sign in with ..." button for OIDC."""

    authentication_form = ThrottledAuthenticationForm

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["oidc_enabled"] = settings.OIDC_ENABLED
        context["oidc_provider_name"] = settings.OIDC_PROVIDER_NAME
        context["password_form"] = settings.LOCAL_LOGIN_ENABLED or settings.LDAP_ENABLED
        context["sso_failed"] = self.request.GET.get("sso") == "failed"
        return context


def admin_login(request, **kwargs):
    """The admin's password form, or the site's sign-in page when no password would work."""
    if not (settings.LOCAL_LOGIN_ENABLED or settings.LDAP_ENABLED):
        return auth_views.redirect_to_login(request.GET.get("next") or reverse("admin:index"))
    return admin.site.login(request, **kwargs)


class _OidcOnly:
    def dispatch(self, request, *args, **kwargs):
        if not settings.OIDC_ENABLED:
            raise Http404("OpenID Connect sign-in is not set up on this site.")
        return super().dispatch(request, *args, **kwargs)


class OidcStartView(_OidcOnly, oidc_views.OIDCAuthenticationRequestView):
    """Sends the browser to the provider's authorization endpoint."""

    def __init__(self, *args, **kwargs):
        # The parent reads the provider's settings here; without OIDC, dispatch answers 404.
        if settings.OIDC_ENABLED:
            super().__init__(*args, **kwargs)


class OidcCallbackView(_OidcOnly, oidc_views.OIDCAuthenticationCallbackView):
    """The provider's redirect back: code for tokens, user, projects, session."""

    def get(self, request):
        try:
            return super().get(request)
        except requests.RequestException as exc:
            # The provider is down or refused the code: a sign-in failure, not a server error.
            log.warning("OIDC sign-in failed talking to the provider: %s", exc)
            return self.login_failure()
