"""Interactive sessions: `open ID` waits for a booking's JupyterLab (or terminal) and opens it.

The session is served by the portal at `session.url` (docs/interactive.md); the browser signs in
to the portal as usual, so the CLI only hands it the address.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.parse
import webbrowser

from .client import ERROR, OK, WAIT_TIMEOUT, Client, CliError
from .output import print_json

BOOKINGS = "/api/v1/bookings/"
WAITING = ("waiting", "starting")


def open_session(client: Client, args) -> int:
    """Wait until the booking's session runs, then print its address and open a browser."""
    deadline = time.monotonic() + args.wait_timeout
    said = ""
    while True:
        booking = client.get(f"{BOOKINGS}{args.id}/")
        session = booking.get("session") or {}
        if not session:
            raise CliError(
                f"Booking {args.id} has no interactive session "
                "(submit one with `gpu-portal submit --jupyter`).",
                exit_code=ERROR,
            )
        state = session.get("state", "")
        if state == "running" and session.get("url"):
            return _opened(client, args, booking, session)
        if state not in WAITING:
            raise CliError(
                f"Booking {args.id}'s session is {state}: {session.get('detail', '')}".rstrip(": "),
                exit_code=ERROR,
            )
        line = f"booking {args.id}: session {state}" + (
            f" ({session['detail']})" if session.get("detail") else ""
        )
        if line != said:
            print(line, file=sys.stderr)
            said = line
        if time.monotonic() >= deadline:
            raise CliError(
                f"Booking {args.id}'s session is not running after {args.wait_timeout:g} s.",
                exit_code=WAIT_TIMEOUT,
            )
        time.sleep(args.interval)


def _opened(client: Client, args, booking: dict, session: dict) -> int:
    url = urllib.parse.urljoin(client.url + "/", session["url"])
    if args.json:
        print_json({"id": booking["id"], "url": url, "session": session})
    else:
        print(url)
    if not args.print_only and _has_browser():
        webbrowser.open(url)
    return OK


def _has_browser() -> bool:
    """A graphical browser to open (a login node over ssh has none: the URL is printed)."""
    if sys.platform in ("darwin", "win32") or os.environ.get("BROWSER"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
