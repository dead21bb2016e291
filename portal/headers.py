"""Browser hardening headers on every response: Content-Security-Policy and Permissions-Policy.

Django 5.2 sends neither (Django 6.0 adds SECURE_CSP; move there when the project upgrades).
The policy allows scripts and styles from the site itself only, no 'unsafe-inline' and no eval:
pages carry no inline scripts, event handlers or style attributes (positions and widths are data
attributes that static/portal/layout.js applies through the CSSOM, which CSP does not block).
"""

from django.conf import settings


class SecurityHeadersMiddleware:
    """Add CONTENT_SECURITY_POLICY and PERMISSIONS_POLICY unless a view set its own."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if settings.CONTENT_SECURITY_POLICY:
            response.headers.setdefault("Content-Security-Policy", settings.CONTENT_SECURITY_POLICY)
        if settings.PERMISSIONS_POLICY:
            response.headers.setdefault("Permissions-Policy", settings.PERMISSIONS_POLICY)
        return response


def policy_header(directives: dict[str, list[str]]) -> str:
    """`{"script-src": ["'self'"]}` as the header's text; refuses 'unsafe-inline' and eval."""
    for name, sources in directives.items():
        unsafe = {"'unsafe-inline'", "'unsafe-eval'"} & set(sources)
        if unsafe:
            raise RuntimeError(f"CONTENT_SECURITY_POLICY {name} must not allow {min(unsafe)}.")
    return "; ".join(" ".join([name, *sources]) for name, sources in directives.items())
