"""Interactive sessions: what the agent runs for a booking that asked for JupyterLab or a terminal.

The session is a real Jupyter server (JupyterLab; a terminal is JupyterLab's terminal), started as
the booking's job: same user, same devices, same stop path. It listens on `host` (the address the
portal reaches, docs/interactive.md) at a port picked here, under the base URL the portal proxies
(protocol.SESSION_PATH), and accepts only the per-session token from the desired state. The token
travels in the environment (JUPYTER_TOKEN), never on the command line, where `ps` would show it.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from agents.protocol import SESSION_PATH, DesiredBooking

DEFAULT_HOST = "127.0.0.1"
# JupyterLab's file for the workspace named "terminal" (jupyterlab_server's slug of the name):
# the portal opens a terminal session at <base URL>lab/workspaces/terminal.
TERMINAL_WORKSPACE_FILE = "terminal-4e68.jupyterlab-workspace"
_TERMINAL_WORKSPACE = {
    "data": {
        "layout-restorer:data": {
            "main": {"dock": {"type": "tab-area", "currentIndex": 0, "widgets": ["terminal:1"]}},
            "left": {"collapsed": True, "visible": True, "widgets": []},
        },
        "terminal:1": {"data": {"name": "1"}},
    },
    "metadata": {"id": "terminal"},
}
_PROBE_TIMEOUT_S = 0.2
# The session's JupyterLab settings defaults (its own app settings directory): never ask
# whether to fetch Jupyter's news, never fetch it or look for updates. The user may still
# change them in Settings; their own user settings apply as everywhere.
_SETTINGS_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {
        "fetchNews": "false",
        "checkForUpdates": False,
    }
}


@dataclass(frozen=True)
class SessionLaunch:
    """How to start one session: its argv, extra environment, and where it will listen."""

    argv: list[str]
    env: dict[str, str]
    host: str
    port: int


def session_launch(
    booking: DesiredBooking,
    *,
    host: str,
    python: str | None,
    home: str,
    as_root: bool,
    workspaces: Path,
) -> SessionLaunch:
    """The JupyterLab command line for `booking`'s session on a free port of `host`.

    `workspaces` is the session's own JupyterLab workspaces directory (the owner may write it);
    a terminal session gets a workspace there that opens one terminal, and every session its
    settings defaults (`app-settings/overrides.json`: no question about news).
    """
    port = free_port(host)
    if booking.interactive == "terminal":
        layout = workspaces / TERMINAL_WORKSPACE_FILE
        layout.write_text(json.dumps(_TERMINAL_WORKSPACE))
    app_settings = workspaces / "app-settings"
    app_settings.mkdir(exist_ok=True)
    (app_settings / "overrides.json").write_text(json.dumps(_SETTINGS_OVERRIDES))
    argv = [
        python or sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ip={host}",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={SESSION_PATH.format(booking_id=booking.booking_id)}",
        # The portal connects from its own address; the token is what keeps others out.
        "--ServerApp.allow_remote_access=True",
        f"--ServerApp.root_dir={home}",
        "--ServerApp.terminals_enabled=True",
        f"--LabApp.workspaces_dir={workspaces}",
        f"--LabApp.app_settings_dir={app_settings}",
        # Sites are often air-gapped: nothing in the session reaches out on its own.
        "--LabApp.extension_manager=readonly",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if as_root:
        argv.append("--allow-root")  # only where a test site maps users to root (--min-uid 0)
    env = {"JUPYTER_TOKEN": booking.session_token or ""}
    return SessionLaunch(argv, env, host, port)


def free_port(host: str) -> int:
    """A port nothing listens on at `host` right now (the session binds it moments later)."""
    with socket.socket(_family(host)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def session_listening(host: str, port: int) -> bool:
    """Whether the session accepts connections yet (Jupyter listens once it is ready)."""
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
