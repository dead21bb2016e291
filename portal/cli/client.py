"""The portal's REST API over urllib: token auth, its one error shape, retries, pagination."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from . import __version__

# Exit codes scripts can test (docs/cli.md has the table).
OK = 0
ERROR = 1
USAGE = 2
NOT_AUTHENTICATED = 3
NOT_FOUND = 4
CONFLICT = 5
UNAVAILABLE = 6
WAIT_TIMEOUT = 7
ENDED = 8

RETRIES = 3
MAX_RETRY_WAIT_S = 30.0
_AUTH_CODES = {"not_authenticated", "authentication_failed"}


class CliError(Exception):
    """A failure to report on stderr and exit with `exit_code`."""

    def __init__(self, message: str, *, exit_code: int = ERROR, code: str = "", fields=None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.code = code
        self.fields = fields or {}
        self.body: dict | None = None


def exit_code_for(status: int, code: str) -> int:
    """The exit code for an API refusal, from its HTTP status and error code."""
    if status == 401 or code in _AUTH_CODES:
        return NOT_AUTHENTICATED
    if status == 404:
        return NOT_FOUND
    if status == 409:
        return CONFLICT
    if status in (429, 502, 503, 504):
        return UNAVAILABLE
    return ERROR


def api_error(status: int, raw: bytes) -> CliError:
    """A CliError from an error response: the API's {"error": {code, message, fields}}."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code, message = str(error.get("code", "")), str(error.get("message", ""))
        fields = error.get("fields") or {}
    else:
        code, message, fields = "", f"HTTP {status}: {raw[:200].decode(errors='replace')}", {}
    if status == 401 or code in _AUTH_CODES:
        message += " Run `gpu-portal login` or set GPU_PORTAL_TOKEN."
    failure = CliError(message, exit_code=exit_code_for(status, code), code=code, fields=fields)
    failure.body = body if isinstance(error, dict) else None
    return failure


class Client:
    """One portal: `get`, `post`, and `get_all` that follows a list's `next` links."""

    def __init__(self, url: str, token: str = "", *, timeout_s: float = 30.0, retries=RETRIES):
        if not url:
            raise CliError(
                "No portal address: pass --url, set GPU_PORTAL_URL or run `gpu-portal login`.",
                exit_code=USAGE,
            )
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        self.retries = retries

    def get(self, path: str, query: dict | None = None):
        return self.request("GET", path, query=query)

    def post(self, path: str, body=None, headers: dict | None = None):
        return self.request("POST", path, body=body if body is not None else {}, headers=headers)

    def get_all(self, path: str, query: dict | None = None, *, limit: int | None = None) -> list:
        """Every row of a paginated list (or the first `limit`), following `next` links."""
        page = self.get(path, query)
        rows = list(page.get("results", []))
        while page.get("next") and (limit is None or len(rows) < limit):
            page = self.request("GET", page["next"])
            rows += page.get("results", [])
        return rows if limit is None else rows[:limit]

    def request(self, method: str, path: str, *, query=None, body=None, headers=None):
        """The JSON answer; 503/429 are retried after their Retry-After, then an error."""
        url = path if path.startswith(("http://", "https://")) else self.url + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        for attempt in range(self.retries + 1):
            try:
                return self._once(method, url, body, headers)
            except _Retry as retry:
                if attempt == self.retries:
                    raise retry.error from None
                print(
                    f"gpu-portal: {retry.error.message} Retrying in {retry.wait_s:g} s.",
                    file=sys.stderr,
                )
                time.sleep(retry.wait_s)
        raise AssertionError("unreachable")

    def _once(self, method: str, url: str, body, headers: dict | None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", f"gpu-portal-cli/{__version__}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Token {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            error = api_error(exc.code, raw)
            if exc.code in (429, 503):
                raise _Retry(error, _retry_after(exc.headers.get("Retry-After"))) from None
            raise error from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            error = CliError(f"Cannot reach {self.url}: {reason}.", exit_code=UNAVAILABLE)
            raise _Retry(error, 1.0) from None
        return json.loads(raw) if raw else {}


class _Retry(Exception):
    def __init__(self, error: CliError, wait_s: float):
        self.error = error
        self.wait_s = wait_s


def _retry_after(value: str | None) -> float:
    try:
        wait = float(value) if value else 1.0
    except ValueError:  # an HTTP date: wait the default
        wait = 1.0
    return min(max(wait, 0.0), MAX_RETRY_WAIT_S)
