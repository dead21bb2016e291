"""Named policies: the published reference points of the wait-time trade-off, as Policy values.

Each preset is a set of ``Policy`` fields; the rest keep their defaults. The replay runs them by
name (``python -m scheduler.replay --policy sjf-easy``) and the sweep beside the shipped default;
a site picks one with ``SCHEDULER_PRESET=<name>`` (``SCHEDULER_<FIELD>`` still overrides a
field). See docs/scheduling.md, "Reference policies".

- ``easy-sjbf``: EASY with shortest-first backfill (Tsafrir, Etsion and Feitelson 2007): the
  oldest booking that cannot start holds the one reservation, the others are tried smallest
  GPU-seconds first.
- ``hrrn-easy``: highest response ratio (waited + duration) / duration first, head reserved.
- ``sjf-easy``: smallest GPU-seconds first, head reserved.
- ``sjf-protect-12h``, ``-1d``, ``-2d``: as ``sjf-easy``, but a booking pending longer than the
  threshold goes ahead of every unprotected one, oldest first, each with a reservation.
- ``conservative``: arrival order, a reservation for every pending booking.

One more named point for a site, not a reference policy: ``multifactor``, the default before
issue 26 (the multifactor priority of age, fair share, size and QOS orders the walk, and every
booking holds a reservation; the oldest is protected).
"""

from __future__ import annotations

import math
from types import MappingProxyType

from scheduler.types import Policy

# No protection beyond what the preset names: a reference policy is exactly its published rule.
_UNPROTECTED = {"protect_after_runs": None, "protect_oldest": 0}


def _sjf_protect(hours: float) -> dict:
    return {
        "order": "sjf",
        "backfill": "easy",
        "protect_oldest": 0,
        "protect_after_runs": math.inf,  # the absolute threshold alone
        "protect_after_max_s": hours * 3600.0,
    }


PRESETS = MappingProxyType(
    {
        "easy-sjbf": {"order": "sjf", "backfill": "easy", "protect_after_runs": None},
        "hrrn-easy": {"order": "hrrn", "backfill": "easy", **_UNPROTECTED},
        "sjf-easy": {"order": "sjf", "backfill": "easy", **_UNPROTECTED},
        "sjf-protect-12h": _sjf_protect(12),
        "sjf-protect-1d": _sjf_protect(24),
        "sjf-protect-2d": _sjf_protect(48),
        "conservative": {"order": "arrival", "backfill": "conservative", **_UNPROTECTED},
        "multifactor": {"order": "priority", "backfill": "conservative"},
    }
)
REFERENCE_NAMES = tuple(name for name in PRESETS if name != "multifactor")


def preset_policy(name: str, **overrides) -> Policy:
    """The Policy of preset ``name`` (a KeyError names an unknown one), fields overridden."""
    return Policy(**{**PRESETS[name], **overrides})
