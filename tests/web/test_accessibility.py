"""axe-core on every page a user or staff member can open: no serious or critical violation,
in the light and the dark theme.

The API docs page (/api/docs/, Swagger UI from drf-spectacular-sidecar) is third-party markup
and is left out. A page added later gets the same check by calling `assert_accessible(page)`.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Gpu, Membership, NodeAlert, Project
from tests.factories import UserFactory, member
from tests.web.conftest import ARTIFACTS, assert_accessible, sign_in
from tests.web.test_screenshots import site  # noqa: F401  (the fixture)

pytestmark = pytest.mark.browser

USER_PAGES = [
    ("overview", "/"),
    ("overview-filtered", "/?state=free"),
    ("book", "/book/"),
    ("book-errors", "/book/?gpus=0"),  # submitted: the form with its field errors
    ("bookings", "/bookings/"),
    ("booking", "/bookings/{booking}/"),
    ("calendar-week", "/calendar/"),
    ("calendar-day", "/calendar/?view=day"),
    ("queue", "/queue/"),
    ("gpu", "/gpus/{gpu}/"),
    ("gpu-slice", "/gpus/{mig_gpu}/?slice={slice}"),
    ("project", "/projects/vision/"),
    ("accounting", "/accounting/?period=7d"),
    ("booking-batch-running", "/bookings/{batch_active}/"),  # live output of a running job
    ("booking-batch-done", "/bookings/{batch_done}/"),  # a finished job's log tail
    ("tokens", "/tokens/"),
    ("tokens-new", "/tokens/"),  # a token just created: its key shown once
    ("notification-settings", "/settings/notifications/"),
    ("action-confirm", "/actions/{action}/"),  # a message's one-click link
    ("action-done", "/actions/{action}/"),  # its button pressed
    ("action-used", "/actions/{action}/"),  # the link opened again: used
]
STAFF_PAGES = [
    ("staff", "/staff/"),
    ("staff-mail", "/staff/mail/"),
    ("staff-queue", "/queue/"),
    ("staff-audit", "/audit/"),
    ("staff-notification-settings", "/settings/notifications/"),  # node alerts too
]
MANAGER_PAGES = [("manager-audit", "/audit/"), ("manager-project", "/projects/vision/")]
SIGNED_OUT_PAGES = [
    ("login", "/accounts/login/"),
    ("action-confirm-signed-out", "/actions/{action}/"),
]
# An OpenID provider set up (the sign-in page shows its button); it need not run to draw the page.
OIDC_ENV = {
    "OIDC_RP_CLIENT_ID": "portal",
    "OIDC_RP_CLIENT_SECRET": "secret",
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "http://127.0.0.1:9/authorize",
    "OIDC_OP_TOKEN_ENDPOINT": "http://127.0.0.1:9/token",
    "OIDC_OP_USER_ENDPOINT": "http://127.0.0.1:9/userinfo",
    "OIDC_OP_JWKS_ENDPOINT": "http://127.0.0.1:9/jwks",
    "OIDC_PROVIDER_NAME": "University SSO",
}


def _press_action(page) -> None:
    page.click("main form button[type=submit]")
    page.wait_for_selector("h1:has-text('Done')")


# What a page needs done in it before the check, by its name.
PREPARE = {
    "book-errors": lambda page: (
        page.click("button:has-text('Submit booking')"),
        page.wait_for_selector("#id_gpus_error"),
    ),
    "tokens-new": lambda page: (
        page.fill("#id_name", "ci runner"),
        page.click("button:has-text('Create token')"),
        page.wait_for_selector("#new-token"),
    ),
    "action-done": _press_action,
    "action-used": lambda page: (
        _press_action(page),
        page.reload(),
        page.wait_for_selector("h1:has-text('cannot be used')"),
    ),
}


@pytest.fixture
def staffed_site(site):  # noqa: F811
    """The screenshot site, plus a project manager and an open alert for the staff panel."""
    carol = UserFactory(username="carol")
    member(carol, Project.objects.get(slug="vision"), Membership.Role.MANAGER)
    mig_gpu = Gpu.objects.filter(mig_mode=True).first()
    gpu = Gpu.objects.get(pk=site["gpu"])
    NodeAlert.objects.create(
        node=gpu.node,
        kind=NodeAlert.Kind.UNBOOKED_PROCESS,
        time=timezone.now() - timedelta(minutes=3),
        device_uuid=Gpu.objects.filter(node=gpu.node).order_by("index")[3].uuid,
        pid=31337,
        user="eve",
        action="report",
        detail="pid 31337 on a device no booking holds",
    )
    return site | {"mig_gpu": mig_gpu.pk, "slice": mig_gpu.mig_instances.first().pk}


def _check(chromium, base_url: str, path: str, name: str, username: str | None) -> None:
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    try:
        if username:
            sign_in(page, base_url, username, "pw-secret-123")
        response = page.goto(base_url + path)
        assert response.status == 200, path
        if name in PREPARE:
            PREPARE[name](page)
        page.wait_for_load_state("networkidle")
        if name == "login-oidc":
            assert page.locator("#oidc-sign-in").text_content() == "Sign in with University SSO"
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"a11y-{name}-{scheme}.png"), full_page=True)
            assert_accessible(page, label=f"{path} ({scheme})")
    finally:
        context.close()


@pytest.mark.parametrize(("name", "path"), USER_PAGES, ids=[n for n, _ in USER_PAGES])
def test_it_has_no_serious_accessibility_violation_for_a_user(
    staffed_site, asgi_server, chromium, name, path
):
    _check(chromium, asgi_server, path.format(**staffed_site), name, "alice")


@pytest.mark.parametrize(("name", "path"), STAFF_PAGES, ids=[n for n, _ in STAFF_PAGES])
def test_it_has_no_serious_accessibility_violation_for_staff(
    staffed_site, asgi_server, chromium, name, path
):
    _check(chromium, asgi_server, path, name, "root")


@pytest.mark.parametrize(("name", "path"), MANAGER_PAGES, ids=[n for n, _ in MANAGER_PAGES])
def test_it_has_no_serious_accessibility_violation_for_a_project_manager(
    staffed_site, asgi_server, chromium, name, path
):
    _check(chromium, asgi_server, path, name, "carol")


@pytest.mark.parametrize(("name", "path"), SIGNED_OUT_PAGES, ids=[n for n, _ in SIGNED_OUT_PAGES])
def test_it_has_no_serious_accessibility_violation_signed_out(
    staffed_site, asgi_server, chromium, name, path
):
    _check(chromium, asgi_server, path.format(**staffed_site), name, None)


@pytest.mark.parametrize("portal_env", [OIDC_ENV])
def test_it_has_no_serious_accessibility_violation_on_the_single_sign_on_page(
    transactional_db, asgi_server, chromium, portal_env
):
    _check(chromium, asgi_server, "/accounts/login/", "login-oidc", None)


def test_it_fails_a_page_with_a_serious_violation(transactional_db, asgi_server, chromium):
    context = chromium.new_context()
    page = context.new_page()
    page.goto(f"{asgi_server}/accounts/login/")
    page.evaluate("document.querySelector('main').append(document.createElement('button'))")
    try:
        with pytest.raises(AssertionError, match=r"button-name \(critical\)"):
            assert_accessible(page)
    finally:
        context.close()
