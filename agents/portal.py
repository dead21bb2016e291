"""The agent's HTTP client for the portal: stdlib urllib, one method per endpoint."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from agents import protocol
from agents.protocol import (
    DesiredState,
    EventsRequest,
    ReadingsRequest,
    RegisterRequest,
    RegisterResponse,
)


class PortalError(Exception):
    """Base of what talking to the portal can raise."""


class AuthError(PortalError):
    """401/403: the node token is wrong or revoked. Retrying will not help."""


class Rejected(PortalError):
    """4xx other than auth: the portal will refuse this very request again, so drop it."""


class PortalUnavailable(PortalError):
    """The portal could not be reached or answered 5xx/garbage; retry later."""


class PortalClient:
    """Calls the agent endpoints of one portal with one node token."""

    def __init__(self, portal_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.base_url = portal_url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s

    @property
    def websocket_url(self) -> str:
        """The push endpoint: the portal URL with ws(s):// and WEBSOCKET_PATH."""
        scheme, rest = self.base_url.split("://", 1)
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{protocol.WEBSOCKET_PATH}"

    @property
    def auth_header(self) -> dict[str, str]:
        """The Authorization header every request (and the websocket) carries."""
        return {"Authorization": f"Bearer {self._token}"}

    def register(self, request: RegisterRequest) -> RegisterResponse:
        """POST the inventory; the answer says how often to report and which policy to enforce."""
        answer = self._call("POST", protocol.REGISTER_PATH, protocol.dumps(request))
        return _validated(RegisterResponse, answer)

    def send_readings(self, request: ReadingsRequest) -> None:
        """POST one sample of all devices."""
        self._call("POST", protocol.READINGS_PATH, protocol.dumps(request))

    def get_desired(self) -> DesiredState:
        """GET which booking holds which device until when."""
        return _validated(DesiredState, self._call("GET", protocol.DESIRED_PATH, None))

    def send_events(self, request: EventsRequest) -> None:
        """POST a batch of events."""
        self._call("POST", protocol.EVENTS_PATH, protocol.dumps(request))

    def _call(self, method: str, path: str, body: bytes | None) -> Any:
        headers = {**self.auth_header, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(self.base_url + path, body, headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _http_error(method, path, exc) from None
        except (OSError, ValueError) as exc:  # URLError, timeouts, resets, bad URLs
            raise PortalUnavailable(f"{method} {path}: {exc}") from None
        return _parse(method, path, raw)


def _http_error(method: str, path: str, exc: urllib.error.HTTPError) -> PortalError:
    detail = exc.read(500).decode(errors="replace")
    exc.close()
    if exc.code in (401, 403):
        return AuthError(f"{method} {path}: HTTP {exc.code}: the portal refused the node token")
    if 400 <= exc.code < 500 and exc.code not in (408, 429):
        return Rejected(f"{method} {path}: HTTP {exc.code}: {detail}")
    return PortalUnavailable(f"{method} {path}: HTTP {exc.code}: {detail}")


def _validated(cls: type, answer: Any) -> Any:
    # A portal answering nonsense is as good as down: keep running and retry later.
    try:
        return protocol.from_json(cls, answer)
    except protocol.ProtocolError as exc:
        raise PortalUnavailable(f"bad {cls.__name__} from the portal: {exc}") from None


def _parse(method: str, path: str, raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise PortalUnavailable(f"{method} {path}: the answer is not JSON") from None
