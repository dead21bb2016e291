"""The allocator's policy from the environment: every ``scheduler.Policy`` field, validated.

``SCHEDULER_<FIELD>`` sets field ``<field>`` (``SCHEDULER_BACKFILL=easy``,
``SCHEDULER_PROTECT_AFTER_RUNS=none``, ``SCHEDULER_QOS_LEVELS=low:0,normal:1,high:2``). A value
that does not parse, or a policy that ``scheduler.Policy`` refuses (an unknown ``backfill``, a
negative weight), is an ImproperlyConfigured error at settings load naming the variable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from django.core.exceptions import ImproperlyConfigured

import scheduler

PREFIX = "SCHEDULER_"


def policy_env_names() -> dict[str, str]:
    """Policy field -> environment variable."""
    return {f.name: PREFIX + f.name.upper() for f in dataclasses.fields(scheduler.Policy)}


def _parse(kind: str, text: str):
    text = text.strip()
    if "None" in kind and text.lower() in ("none", "off", ""):
        return None
    if kind.startswith("bool"):
        if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
            raise ValueError("expected true or false")
        return text.lower() in ("1", "true", "yes", "on")
    if kind.startswith("int"):
        return int(text)
    if kind.startswith("float"):
        return float(text)
    if kind.startswith("tuple"):
        levels = []
        for item in text.split(","):
            name, _, level = item.strip().partition(":")
            if not name or not level:
                raise ValueError("expected name:level pairs, e.g. low:0,normal:1,high:2")
            levels.append((name, int(level)))
        return tuple(levels)
    return text


def policy_settings(environ: Mapping[str, str]) -> dict:
    """The Policy overrides set in ``environ`` (field -> value), checked by building the Policy."""
    kinds = {f.name: str(f.type) for f in dataclasses.fields(scheduler.Policy)}
    overrides = {}
    for field, name in policy_env_names().items():
        if name not in environ:
            continue
        try:
            overrides[field] = _parse(kinds[field], environ[name])
        except ValueError as error:
            raise ImproperlyConfigured(f"{name}={environ[name]!r}: {error}") from error
    try:
        scheduler.Policy(**overrides)
    except ValueError as error:
        names = policy_env_names()
        raise ImproperlyConfigured(
            f"scheduler policy from {', '.join(names[f] for f in overrides) or 'defaults'}: {error}"
        ) from error
    return overrides
