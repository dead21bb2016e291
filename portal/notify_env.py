"""Notification and idle-reclaim settings, read from the environment and validated (see
docs/notifications.md). portal.settings assigns each by name; one place reads and checks them all."""

from portal.env import (
    SettingError,
    env,
    envbool,
    envfloat,
    envint,
    envlist,
    envnetworks,
    envurl,
)

EVENTS = (
    "queued",
    "moved",
    "starting_soon",
    "started",
    "extended",
    "ending_soon",
    "ended",
    "preempted",
    "failed",
    "idle",
    "reclaimed",
    "budget",
    "node_down",
    "foreign_process",
    "maintenance",
)
CHANNELS = ("email", "slack", "webhook")


def notify_settings() -> dict:
    """The validated settings; a bad value stops the start with the name and the reason."""
    values = {
        "SLACK_BOT_TOKEN": env("SLACK_BOT_TOKEN"),
        "SLACK_SIGNING_SECRET": env("SLACK_SIGNING_SECRET"),
        "SLACK_API_URL": envurl(
            "SLACK_API_URL", "https://slack.com/api", schemes=("https", "http")
        ).rstrip("/"),
        "NOTIFY_DEFAULT_EVENTS": envlist("NOTIFY_DEFAULT_EVENTS", ",".join(EVENTS)),
        "NOTIFY_DEFAULT_CHANNELS": envlist("NOTIFY_DEFAULT_CHANNELS", ",".join(CHANNELS)),
        "NOTIFY_SEND_TIMEOUT_S": envfloat("NOTIFY_SEND_TIMEOUT_S", 10.0, low=0.1, high=300),
        "NOTIFY_MAX_ATTEMPTS": envint("NOTIFY_MAX_ATTEMPTS", 6, low=1, high=50),
        "NOTIFY_RETRY_BACKOFF_S": envfloat("NOTIFY_RETRY_BACKOFF_S", 30.0, low=0, high=3600),
        "NOTIFY_ACTION_TTL_S": envint("NOTIFY_ACTION_TTL_S", 24 * 3600, low=60, high=30 * 86400),
        "NOTIFY_STARTING_SOON_MIN": envint("NOTIFY_STARTING_SOON_MIN", 15, low=1, high=7 * 1440),
        "NOTIFY_ENDING_SOON_MIN": envint("NOTIFY_ENDING_SOON_MIN", 15, low=1, high=7 * 1440),
        "NOTIFY_MOVED_THRESHOLD_MIN": envint(
            "NOTIFY_MOVED_THRESHOLD_MIN", 30, low=1, high=7 * 1440
        ),
        "NOTIFY_BUDGET_FRACTION": envfloat("NOTIFY_BUDGET_FRACTION", 0.9, low=0.01, high=1),
        "NOTIFY_SCAN_INTERVAL_S": envfloat("NOTIFY_SCAN_INTERVAL_S", 60.0, low=1, high=3600),
        "IDLE_RECLAIM_ENABLED": envbool("IDLE_RECLAIM_ENABLED", "False"),
        "IDLE_UTIL_THRESHOLD": envfloat("IDLE_UTIL_THRESHOLD", 5.0, low=0, high=100),
        "IDLE_MINUTES": envint("IDLE_MINUTES", 60, low=1, high=7 * 1440),
        "IDLE_GRACE_MINUTES": envint("IDLE_GRACE_MINUTES", 30, low=1, high=7 * 1440),
        "IDLE_MEMORY_MIB": envint("IDLE_MEMORY_MIB", 512, low=0, high=1 << 20),
        # User-set destinations (portal/outbound.py): https only unless this; never a
        # loopback, private or link-local address unless inside one of these networks.
        "NOTIFY_ALLOW_HTTP": envbool("NOTIFY_ALLOW_HTTP", "False"),
        "NOTIFY_ALLOWED_NETWORKS": envnetworks("NOTIFY_ALLOWED_NETWORKS"),
    }
    _check(values)
    return values


def _check(v: dict) -> None:
    problems = [
        f"NOTIFY_DEFAULT_EVENTS: unknown event {e!r}"
        for e in v["NOTIFY_DEFAULT_EVENTS"]
        if e not in EVENTS
    ] + [
        f"NOTIFY_DEFAULT_CHANNELS: unknown channel {c!r}"
        for c in v["NOTIFY_DEFAULT_CHANNELS"]
        if c not in CHANNELS
    ]
    if problems:
        raise SettingError("; ".join(problems))
