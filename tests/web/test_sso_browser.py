"""Signing in through the OpenID provider's redirect in headless Chromium."""

import pytest

from portal.models import GroupMappingRule
from tests.factories import ProjectFactory
from tests.sso_servers import IDP_PASSWORD
from tests.web.conftest import ARTIFACTS

pytestmark = pytest.mark.browser


@pytest.fixture
def portal_env(oidc_provider):
    return oidc_provider.portal_env()


def test_it_signs_in_through_the_provider_and_lands_in_the_mapped_project(
    oidc_provider, asgi_server, browser_page
):
    page = browser_page
    vision = ProjectFactory(slug="vision", name="Vision lab")
    GroupMappingRule.objects.create(group="gpu-*", project=vision)
    oidc_provider.user("nora", "gpu-vision")
    oidc_provider.allow_redirect(f"{asgi_server}/oidc/callback/")

    page.goto(f"{asgi_server}/")
    page.wait_for_url(f"{asgi_server}/accounts/login/?next=/")
    page.screenshot(path=str(ARTIFACTS / "sso-login-page.png"))
    page.click("text=Sign in with Test IdP")
    page.wait_for_url(f"{oidc_provider.url}/login/**")
    page.fill("#idp-username", "nora")
    page.fill("#idp-password", IDP_PASSWORD)
    page.click("#idp-submit")

    page.wait_for_url(f"{asgi_server}/")
    nav = page.locator("nav[aria-label=Main]")
    assert nav.locator("a[href='/projects/vision/']").text_content() == "vision"
    assert "Sign out nora" in page.text_content("header")
