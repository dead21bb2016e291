"""Small helpers for reading settings from the environment (secrets may come from NAME_FILE)."""

import os


def env(name: str, default: str = "") -> str:
    """Return $NAME, or the contents of the file named by $NAME_FILE, or the default."""
    path = os.environ.get(f"{name}_FILE")
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    return os.environ.get(name, default)


def envbool(name: str, default: str = "False") -> bool:
    return env(name, default).strip().lower() in ("1", "true", "yes", "on")


def envint(name: str, default: int) -> int:
    """$NAME as an int; unset or empty (a compose file's `${NAME:-}`) means the default."""
    value = env(name).strip()
    return int(value) if value else default


def envfloat(name: str, default: float) -> float:
    value = env(name).strip()
    return float(value) if value else default


def envlist(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in env(name, default).split(",") if item.strip()]
