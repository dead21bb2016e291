"""A batch job's signal and rendezvous ports: parsing shared by the site's settings and requests.

`USR1@120` (Slurm's `--signal`) means SIGUSR1 120 seconds before the end; `SIGUSR1` and a bare
`USR1` (60 seconds, Slurm's default) are read too. The names are the agent protocol's
(agents.protocol.WarnSignal): signals a job can catch.
"""

from __future__ import annotations

import typing

from agents.protocol import WarnSignal
from scheduler.dependencies import whole_number

SIGNALS = typing.get_args(WarnSignal)
SIGNAL_DEFAULT_BEFORE_S = 60
SIGNAL_BEFORE_MAX_S = 86_400


def signal_parse(text: str) -> tuple[str, int]:
    """(name, seconds before the end) of a `NAME[@SECONDS]` spec; ValueError says what is wrong."""
    name, at, seconds = text.strip().partition("@")
    name = name.strip().upper().removeprefix("SIG")
    if name not in SIGNALS:
        raise ValueError(f"{name or text!r} is not a signal a job can catch ({', '.join(SIGNALS)})")
    if not at:
        return name, SIGNAL_DEFAULT_BEFORE_S
    before = whole_number(seconds.strip())
    if before is None or not 0 < before <= SIGNAL_BEFORE_MAX_S:
        raise ValueError(
            f"the time after @ must be a whole number of seconds (digits 0-9), 1 to "
            f"{SIGNAL_BEFORE_MAX_S}"
        )
    return name, before


def port_range_parse(text: str) -> tuple[int, int]:
    """`LOW-HIGH` as two ports, LOW <= HIGH, both between 1024 and 65535."""
    low, dash, high = text.partition("-")
    first, last = whole_number(low.strip()), whole_number((high if dash else low).strip())
    if first is None or last is None:
        raise ValueError("expected LOW-HIGH, e.g. 29500-29999")
    if not 1024 <= first <= last <= 65535:
        raise ValueError("expected LOW-HIGH with 1024 <= LOW <= HIGH <= 65535")
    return first, last
