"""Where the portal is and who we are: the config file, overridden by the environment.

The file is $XDG_CONFIG_HOME/gpu-portal/config.json (default ~/.config/gpu-portal/config.json),
written with mode 0600 because it holds an API token. GPU_PORTAL_URL and GPU_PORTAL_TOKEN override
what it says (scripts, CI); a --url option overrides both.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

URL_ENV = "GPU_PORTAL_URL"
TOKEN_ENV = "GPU_PORTAL_TOKEN"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str
    username: str = ""


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpu-portal" / "config.json"


def read_file() -> dict:
    """The config file's contents; {} when there is none. A broken file is an error, not {}."""
    path = config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); fix or delete it.") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} should hold a JSON object.")
    return data


def settings(url: str | None = None) -> Settings:
    """The portal address and token to use: --url, then the environment, then the file."""
    stored = read_file()
    return Settings(
        url=(url or os.environ.get(URL_ENV) or stored.get("url") or "").rstrip("/"),
        token=os.environ.get(TOKEN_ENV) or stored.get("token") or "",
        username=stored.get("username", ""),
    )


def write_file(data: dict) -> Path:
    """Write the config file readable by its owner only (the directory too), atomically."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    os.chmod(partial, 0o600)  # an older file of that name may have had wider bits
    os.replace(partial, path)
    return path
