from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from portal.sso import views as sso_views
from portal.web import ops
from portal.web.forms import ThrottledAdminAuthenticationForm


def status_429_when_throttled(view):
    """A login view whose form refused a throttled attempt answers 429 Too Many Requests."""

    def wrapped(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        form = (getattr(response, "context_data", None) or {}).get("form")
        wait = getattr(form, "throttled_s", 0)
        if wait:
            response.status_code = 429
            response["Retry-After"] = str(wait)
        return response

    return wrapped


admin.site.login_form = ThrottledAdminAuthenticationForm

urlpatterns = [
    path("metrics", ops.prometheus_metrics, name="metrics"),
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("admin/login/", status_429_when_throttled(sso_views.admin_login)),
    path("admin/", admin.site.urls),
    path("accounts/login/", status_429_when_throttled(sso_views.LoginView.as_view()), name="login"),
    # OpenID Connect (404 unless set up); the names are the ones mozilla-django-oidc reverses.
    path("oidc/authenticate/", sso_views.OidcStartView.as_view(), name="oidc_authentication_init"),
    path(
        "oidc/callback/", sso_views.OidcCallbackView.as_view(), name="oidc_authentication_callback"
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("portal.api.urls")),
    path("", include("portal.web.urls")),
]
