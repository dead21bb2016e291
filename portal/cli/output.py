"""Human output: aligned plain-text tables, times and durations. --json bypasses all of this."""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timedelta, timezone

# datetime.UTC is 3.11+; the client runs on Python 3.8 and later.
UTC = timezone.utc

# Set from --utc by main(); local time otherwise.
USE_UTC = False


def print_json(data) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def table(headers: list[str], rows: list[list]) -> str:
    """Columns padded to their widest cell; None and "" show as '-'."""
    lines = [list(headers)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in lines
    )


def _cell(value) -> str:
    return "-" if value is None or value == "" else str(value)


def parse_time(value: str | None) -> datetime | None:
    """The API's ISO 8601 timestamps (with Z or an offset)."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def when(value: str | None) -> str | None:
    """A timestamp as '2026-12-03 08:05', in local time (UTC with --utc, marked so): the same
    full date whatever the year, so columns line up and the day is never guessed."""
    moment = parse_time(value)
    if moment is None:
        return None
    moment = moment.astimezone(UTC) if USE_UTC else moment.astimezone()
    return moment.strftime("%Y-%m-%d %H:%M") + (" UTC" if USE_UTC else "")


def duration(seconds: int | float | None) -> str | None:
    """3600 -> '1h', 5400 -> '1h30m', 93600 -> '1d2h'; minutes below an hour."""
    if seconds is None:
        return None
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m")] + ([(secs, "s")] if seconds < 60 else [])
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"


# ASCII digits only ([0-9], not \d: that takes other scripts' digits too, as int() does).
_DURATION = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?\Z")
_CLOCK = re.compile(r"(?:([0-9]+)-)?([0-9]+):([0-9]+)(?::([0-9]+))?\Z")
_MINUTES = re.compile(r"[0-9]+\Z")
DURATION_TEXT_MAX = 32  # characters of a duration: '1d2h3m4s' and '10-12:00:00' fit many times
DURATION_MAX_S = 100 * 365 * 86400  # far past any site's longest booking; datetimes overflow later


def parse_duration(text: str) -> int:
    """Seconds from '90m', '2h', '1h30m', '1d', '45s', Slurm's 'HH:MM:SS', 'D-HH:MM:SS' or
    'MM:SS', or a bare number of minutes (as Slurm's --time reads one)."""
    text = text.strip().lower()
    if len(text) > DURATION_TEXT_MAX:
        raise ValueError(f"a duration is at most {DURATION_TEXT_MAX} characters")
    seconds = _seconds(text)
    if seconds is None:
        raise ValueError(f"'{text}' is not a duration (try 90m, 2h, 1h30m, 1d or HH:MM:SS)")
    if seconds > DURATION_MAX_S:
        raise ValueError(f"'{text}' is longer than any booking can be")
    return seconds


def _seconds(text: str) -> int | None:
    if _MINUTES.match(text):
        return int(text) * 60
    match = _DURATION.match(text)
    if match and any(match.groups()):
        d, h, m, s = (int(g or 0) for g in match.groups())
        return ((d * 24 + h) * 60 + m) * 60 + s
    match = _CLOCK.match(text)
    if match:
        d, a, b, c = match.groups()
        h, m, s = (int(a), int(b), int(c)) if c is not None else (0, int(a), int(b))
        return ((int(d or 0) * 24 + h) * 60 + m) * 60 + s
    return None


_FRACTION = re.compile(r"(?:0?\.[0-9]{1,6}|0)\Z")
_MEMORY = re.compile(r"([0-9]{1,10})(?:(k|m|g|t)(?:i?b)?)?\Z")
_MEMORY_UNITS_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024, None: 1}
MEMORY_MAX_MIB = 2**31 - 1


def parse_fraction(text: str) -> float:
    """A share of one GPU, 0 < F < 1, from '0.25' or '.5' (ASCII digits, at most 6 decimals)."""
    text = text.strip()
    if not _FRACTION.match(text) or not 0 < float(text) < 1:
        raise ValueError(f"'{text}' is not a fraction between 0 and 1 (try 0.25)")
    return float(text)


def parse_memory_mib(text: str) -> int:
    """MiB from '20G', '20GiB', '20GB', '512M', '1T' (units of 1024) or a bare number of MiB."""
    match = _MEMORY.match(text.strip().lower())
    if not match:
        raise ValueError(f"'{text}' is not a memory size (try 20G or 512M)")
    mib = int(match.group(1)) * _MEMORY_UNITS_MIB[match.group(2)]
    if not 1 <= mib <= MEMORY_MAX_MIB or mib != int(mib):
        raise ValueError(f"'{text}' is not a whole number of MiB between 1 and {MEMORY_MAX_MIB}")
    return int(mib)


def parse_moment(text: str) -> str:
    """An ISO 8601 time for the API from 'YYYY-MM-DD HH:MM' (local unless it names a zone),
    'now', or 'now+2h'."""
    text = text.strip()
    if text.lower().startswith("now"):
        rest = text[3:].lstrip("+").strip()
        moment = datetime.now(UTC) + timedelta(seconds=parse_duration(rest) if rest else 0)
        return moment.isoformat()
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"'{text}' is not a time (try 2030-01-01T09:00 or now+1h)") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC) if USE_UTC else moment.astimezone()
    return moment.isoformat()


def what(booking: dict) -> str:
    """'2 GPU', '1 GPU A100-80GB', '16 GPU any models', 'MIG 3g.40gb', '0.25 shared GPU' or
    '0.25 shared GPU 20480MiB'."""
    if booking.get("gpu_fraction") is not None or booking.get("gpu_memory_mib") is not None:
        parts = ["shared GPU"]
        if booking.get("gpu_fraction") is not None:
            parts.insert(0, f"{booking['gpu_fraction']:g}")
        if booking.get("gpu_memory_mib") is not None:
            parts.append(f"{booking['gpu_memory_mib']}MiB")
        base = " ".join(parts)
    elif booking.get("mig_profile"):
        base = f"MIG {booking['mig_profile']}"
    else:
        base = f"{booking.get('gpus') or 0} GPU"
    if booking.get("mixed_models"):
        return f"{base} any models"
    return f"{base} {booking['gpu_model']}" if booking.get("gpu_model") else base
