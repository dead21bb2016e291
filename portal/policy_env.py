"""The allocator's policy from the environment: every ``scheduler.Policy`` field, validated.

``SCHEDULER_<FIELD>`` sets field ``<field>`` (``SCHEDULER_BACKFILL=easy``,
``SCHEDULER_PROTECT_AFTER_RUNS=none``, ``SCHEDULER_QOS_LEVELS=low:0,normal:1,high:2``). A value
that does not parse, or a policy that ``scheduler.Policy`` refuses (an unknown ``backfill``, a
negative weight), is a SettingError at settings load naming the variable.
``SCHEDULER_PRESET=<name>`` starts from a named policy of ``scheduler.presets`` (a reference
point of the wait-time trade-off, docs/scheduling.md) instead of the defaults; the
``SCHEDULER_<FIELD>`` values set beside it override its fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import scheduler
from portal.env import SettingError, parse_bool
from scheduler.presets import PRESETS

PREFIX = "SCHEDULER_"
PRESET_ENV = PREFIX + "PRESET"


def policy_env_names() -> dict[str, str]:
    """Policy field -> environment variable."""
    return {f.name: PREFIX + f.name.upper() for f in dataclasses.fields(scheduler.Policy)}


def _parse(name: str, kind: str, text: str):
    text = text.strip()
    if "None" in kind and text.lower() in ("none", "off", ""):
        return None
    if kind.startswith("bool"):
        if not text:
            raise ValueError("expected true or false (or 1/0, yes/no, on/off)")
        return parse_bool(name, text, False)
    if kind.startswith("int"):
        return _number(int, text, "a whole number")
    if kind.startswith("float"):
        return _number(float, text, "a number")
    if kind.startswith("tuple"):
        levels = []
        for item in text.split(","):
            level_name, _, level = item.strip().partition(":")
            if not level_name or not level:
                raise ValueError("expected name:level pairs, e.g. low:0,normal:1,high:2")
            levels.append((level_name, _number(int, level, "whole-number levels")))
        return tuple(levels)
    return text


def _number(kind: type, text: str, expected: str):
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"expected {expected}") from None


def _preset(name: str) -> dict:
    """The fields of preset ``name`` ({} for none)."""
    if not name:
        return {}
    if name not in PRESETS:
        raise SettingError(f"{PRESET_ENV}={name!r}: expected one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])


def policy_settings(environ: Mapping[str, str]) -> dict:
    """The Policy overrides set in ``environ`` (field -> value), checked by building the Policy."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(scheduler.Policy)}
    overrides = _preset(environ.get(PRESET_ENV, "").strip())
    for field, name in policy_env_names().items():
        if name not in environ:
            continue
        try:
            overrides[field] = _parse(name, kinds[field], environ[name])
        except ValueError as error:
            raise SettingError(f"{name}={environ[name]!r}: {error}") from None
    try:
        scheduler.Policy(**overrides)
    except ValueError as error:
        used = [name for name in [PRESET_ENV, *policy_env_names().values()] if name in environ]
        raise SettingError(
            f"scheduler policy from {', '.join(used) or 'defaults'}: {error}"
        ) from None
    return overrides
