"""Helpers for the sign-in tests: settings from environment variables, and an OIDC round trip."""

from urllib.parse import urljoin, urlsplit

import requests

from portal.sso.config import sign_in_settings
from tests.sso_servers import IDP_PASSWORD


def use_sign_in_env(settings, env: dict[str, str]) -> None:
    """Give the running portal the sign-in settings these environment variables would."""
    for name, value in sign_in_settings(lambda n, d="": env.get(n, d)).items():
        setattr(settings, name, value)


def oidc_sign_in(client, *, username: str, password: str = IDP_PASSWORD, next_url: str = ""):
    """Sign in through the provider as a browser would; the portal's answer to the callback."""
    start = client.get("/oidc/authenticate/" + (f"?next={next_url}" if next_url else ""))
    assert start.status_code == 302, start
    idp = requests.Session()
    login_page = idp.get(start["Location"], timeout=10)
    assert login_page.status_code == 200 and "idp-username" in login_page.text
    logged_in = idp.post(
        login_page.url,
        data={
            "username": username,
            "password": password,
            "csrfmiddlewaretoken": idp.cookies["idp_csrftoken"],
        },
        allow_redirects=False,
        timeout=10,
    )
    assert logged_in.status_code == 302, logged_in.text
    authorize_url = urljoin(logged_in.url, logged_in.headers["Location"])
    authorized = idp.get(authorize_url, allow_redirects=False, timeout=10)
    assert authorized.status_code == 302, authorized.text
    back = urlsplit(authorized.headers["Location"])
    assert back.path == "/oidc/callback/", authorized.headers["Location"]
    return client.get(f"{back.path}?{back.query}")
