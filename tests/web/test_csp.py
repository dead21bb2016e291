"""The pages keep to a Content-Security-Policy without 'unsafe-inline': no violation anywhere.

Chromium reports every blocked inline style attribute, inline script or eval as a
securitypolicyviolation event; the test collects them on every page (charts included).
"""

import pytest

from tests.web.conftest import ARTIFACTS, sign_in
from tests.web.test_screenshots import PAGES, site  # noqa: F401  (the fixture)

pytestmark = pytest.mark.browser

COLLECT = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") +
                    " at " + e.sourceFile + ":" + e.lineNumber + " " + (e.sample || ""));
});
"""


def _violations(page) -> list[str]:
    return page.evaluate("window.__csp")


def test_it_sends_a_strict_policy_and_no_page_breaks_it(site, asgi_server, chromium):  # noqa: F811
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(COLLECT)
    page = context.new_page()
    console = []
    page.on(
        "console",
        lambda m: console.append(m.text) if "Content Security Policy" in m.text else None,
    )
    login = page.goto(f"{asgi_server}/accounts/login/")
    policy = login.headers["content-security-policy"]
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "camera=()" in login.headers["permissions-policy"]
    found = {"login": _violations(page)}
    sign_in(page, asgi_server, "alice", "pw-secret-123")
    for name, path in [*PAGES, ("api-docs", "/api/docs/")]:
        response = page.goto(asgi_server + path.format(**site))
        assert response.status == 200, path
        page.wait_for_load_state("networkidle")
        found[name] = _violations(page)
    page.screenshot(path=str(ARTIFACTS / "csp-last.png"), full_page=True)
    context.close()
    broken = [f"{name}: {v}" for name, found_there in found.items() for v in found_there]
    assert broken == [], "\n".join(broken)
    assert console == []


def test_it_serves_plotlys_own_style_rules_as_the_bundle_holds_them():
    from django.conf import settings

    from portal.web.plotly_css import bundled_css

    served = (settings.BASE_DIR / "static" / "portal" / "plotly.css").read_text()
    assert served == bundled_css(), (
        "run: python -m portal.web.plotly_css > static/portal/plotly.css"
    )
    assert ".js-plotly-plot .plotly .modebar{" in served


def test_it_keeps_the_admin_and_the_staff_panel_within_the_policy(site, asgi_server, chromium):  # noqa: F811
    from tests.factories import UserFactory

    UserFactory(username="root", is_staff=True, is_superuser=True)
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.add_init_script(COLLECT)
    page = context.new_page()
    page.goto(f"{asgi_server}/admin/login/")
    page.fill("#id_username", "root")
    page.fill("#id_password", "pw-secret-123")
    page.click("input[type=submit]")
    page.wait_for_url(f"{asgi_server}/admin/")
    found = []
    for path in (
        "/admin/",
        "/admin/portal/booking/",
        f"/admin/portal/booking/{site['booking']}/change/",
        "/staff/",
        "/audit/",
        "/settings/notifications/",
    ):
        assert page.goto(asgi_server + path).status == 200, path
        page.wait_for_load_state("networkidle")
        found += [f"{path}: {v}" for v in _violations(page)]
    context.close()
    assert found == [], "\n".join(found)
