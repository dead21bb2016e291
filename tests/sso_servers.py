"""Real identity servers on loopback for the sign-in tests: an OpenID provider and an LDAP server.

Both run for the whole test session as subprocesses on free ports, with their data in a temporary
folder, and stop at its end. Imported by tests/conftest.py so every test folder can use them.
"""

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from portal.web.asgi_process import ROOT, free_port

OIDC_CLIENT_ID = "gpu-portal"
OIDC_CLIENT_SECRET = "test-client-secret"
IDP_PASSWORD = "idp-secret-123"


def _wait_listening(process: subprocess.Popen, port: int, what: str, log: Path) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{what} did not listen on {port} in time:\n{log.read_text()}")


def _stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class OidcProvider:
    """The test OpenID provider: its base URL and a way to change its users and client."""

    url: str
    env: dict

    def control(self, *args: str) -> None:
        command = [sys.executable, "-m", "tests.sso.idp.control", *args]
        subprocess.run(command, cwd=ROOT, env=self.env, check=True, capture_output=True)

    def user(self, name: str, *groups: str) -> None:
        """Create or update user `name` (password IDP_PASSWORD) in exactly `groups`."""
        self.control("user", name, IDP_PASSWORD, *groups)

    def allow_redirect(self, uri: str) -> None:
        self.control("redirect", OIDC_CLIENT_ID, uri)

    def portal_env(self, **extra: str) -> dict[str, str]:
        """The portal's environment variables for signing in with this provider."""
        return {
            "OIDC_RP_CLIENT_ID": OIDC_CLIENT_ID,
            "OIDC_RP_CLIENT_SECRET": OIDC_CLIENT_SECRET,
            "OIDC_OP_AUTHORIZATION_ENDPOINT": f"{self.url}/openid/authorize",
            "OIDC_OP_TOKEN_ENDPOINT": f"{self.url}/openid/token",
            "OIDC_OP_USER_ENDPOINT": f"{self.url}/openid/userinfo",
            "OIDC_OP_JWKS_ENDPOINT": f"{self.url}/openid/jwks",
            "OIDC_RP_SCOPES": "openid email profile groups",
            "OIDC_PROVIDER_NAME": "Test IdP",
        } | extra


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory):
    """django-oidc-provider serving on 127.0.0.1, with the portal registered as a client."""
    folder = tmp_path_factory.mktemp("oidc-idp")
    env = {key: value for key, value in os.environ.items() if not key.startswith("DJANGO_")} | {
        "DJANGO_SETTINGS_MODULE": "tests.sso.idp.settings",
        "IDP_DB": str(folder / "idp.db"),
    }
    port = free_port()
    provider = OidcProvider(url=f"http://127.0.0.1:{port}", env=env)
    provider.control("setup", OIDC_CLIENT_ID, OIDC_CLIENT_SECRET)
    provider.allow_redirect("http://testserver/oidc/callback/")
    log = folder / "server.log"
    command = [sys.executable, "-m", "django", "runserver", f"127.0.0.1:{port}", "--noreload"]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_listening(process, port, "the test OpenID provider", log)
        yield provider
    finally:
        _stop(process)
