"""The agent <-> portal wire protocol, shared by both sides.

The portal imports this module too, so it must stay free of Django and of anything
the node agent alone needs. Messages are frozen dataclasses; `to_json` turns one
into a JSON-ready dict and `from_json` validates a dict (or JSON text) back into
one, raising `ProtocolError` that names the offending field.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

PROTOCOL_VERSION = 1

REGISTER_PATH = "/api/v1/agent/register/"
READINGS_PATH = "/api/v1/agent/readings/"
DESIRED_PATH = "/api/v1/agent/desired/"
EVENTS_PATH = "/api/v1/agent/events/"
WEBSOCKET_PATH = "/ws/agent/"

Enforcement = Literal["report", "warn", "kill"]
EventKind = Literal["started", "exited", "stopped", "foreign_process", "unbooked_process"]


class ProtocolError(ValueError):
    """A message does not match the protocol; `field` names where (e.g. `gpus[0].uuid`)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class MigInventory:
    """One MIG instance as the node discovered it."""

    uuid: str
    profile: str
    slices: int
    memory_total_mib: int


@dataclass(frozen=True)
class GpuInventory:
    """One physical GPU and, when MIG mode is on, its MIG instances."""

    index: int
    uuid: str
    model: str
    memory_total_mib: int
    mig_mode: bool
    mig_instances: list[MigInventory] = field(default_factory=list)


@dataclass(frozen=True)
class RegisterRequest:
    """POST REGISTER_PATH: the node's inventory, sent at start and after any reconnect."""

    hostname: str
    agent_version: str
    gpus: list[GpuInventory]
    protocol: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class RegisterResponse:
    """200 answer to a register: the settings the portal wants this node to use."""

    node: str
    report_interval_s: float
    sync_interval_s: float
    enforcement: Enforcement


@dataclass(frozen=True)
class ProcessReading:
    """A process NVML (or the simulator) sees on a device."""

    pid: int
    user: str | None
    used_memory_mib: int | None
    name: str | None


@dataclass(frozen=True)
class DeviceReading:
    """One sample of a whole GPU or MIG instance; None means the value is unavailable."""

    uuid: str
    utilization_gpu: float | None
    utilization_memory: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: float | None
    power_w: float | None
    processes: list[ProcessReading] = field(default_factory=list)


@dataclass(frozen=True)
class ReadingsRequest:
    """POST READINGS_PATH: one sample of every device on the node."""

    hostname: str
    time: datetime
    readings: list[DeviceReading]


@dataclass(frozen=True)
class DesiredBooking:
    """A booking that holds devices on this node; `command` is launched when set."""

    booking_id: int
    owner: str
    device_uuids: list[str]
    start: datetime
    end: datetime
    command: str | None = None


@dataclass(frozen=True)
class DesiredState:
    """GET DESIRED_PATH: the active bookings on this node, versioned by `generation`."""

    generation: int
    bookings: list[DesiredBooking]


@dataclass(frozen=True)
class Event:
    """Something the agent did or saw: a launch, an exit, a stop, a process it objects to."""

    kind: EventKind
    time: datetime
    detail: str = ""
    booking_id: int | None = None
    exit_code: int | None = None
    log_tail: str | None = None
    device_uuid: str | None = None
    pid: int | None = None
    user: str | None = None
    action: Enforcement | None = None


@dataclass(frozen=True)
class EventsRequest:
    """POST EVENTS_PATH: a batch of events, oldest first."""

    events: list[Event]


@dataclass(frozen=True)
class AcceptedResponse:
    """202 answer to readings and to events: how many items the portal stored."""

    accepted: int


@dataclass(frozen=True)
class PushMessage:
    """What the portal pushes over WEBSOCKET_PATH; the agent then pulls desired state."""

    type: Literal["desired_changed"]
    generation: int


def utcnow() -> datetime:
    """The current time, timezone-aware UTC, as every message carries it."""
    return datetime.now(UTC)


def to_json(message: Any) -> dict[str, Any]:
    """Turn a message dataclass into a JSON-ready dict (datetimes as ISO-8601 UTC)."""
    return {f.name: _encode(getattr(message, f.name)) for f in dataclasses.fields(message)}


def dumps(message: Any) -> bytes:
    """Serialize a message to UTF-8 JSON bytes, ready for an HTTP body."""
    return json.dumps(to_json(message), separators=(",", ":")).encode()


def from_json(cls: type, data: Any) -> Any:
    """Validate `data` (a dict, or JSON text/bytes) into an instance of message class `cls`."""
    if isinstance(data, str | bytes | bytearray):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ProtocolError("body", f"not JSON: {exc}") from None
    return _decode_dataclass(cls, data, "")


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if dataclasses.is_dataclass(value):
        return to_json(value)
    return value


def _decode_dataclass(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ProtocolError(path or "body", "must be an object")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name in data:
            kwargs[f.name] = _decode(hints[f.name], data[f.name], where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ProtocolError(where, "is required")
    return cls(**kwargs)


def _decode(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode(inner, value, where)
    if value is None:
        raise ProtocolError(where, "must not be null")
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(where, "must be a list")
        (inner,) = typing.get_args(hint)
        return [_decode(inner, item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is Literal:
        return _decode_choice(typing.get_args(hint), value, where)
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, value, where)
    return _decode_scalar(hint, value, where)


def _decode_choice(choices: tuple, value: Any, where: str) -> Any:
    if value not in choices:
        raise ProtocolError(where, f"must be one of {', '.join(map(str, choices))}")
    return value


def _decode_scalar(hint: type, value: Any, where: str) -> Any:
    # bool is an int subclass in Python but not in JSON: keep them apart.
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(where, "must be a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(where, "must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(where, "must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(where, "must be a string")
        return value
    if hint is datetime:
        return _decode_time(value, where)
    raise TypeError(f"protocol.py cannot decode {hint!r}")  # a bug here, not bad input


def _decode_time(value: Any, where: str) -> datetime:
    if not isinstance(value, str):
        raise ProtocolError(where, "must be an ISO-8601 string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ProtocolError(where, "must be an ISO-8601 string") from None
    if parsed.tzinfo is None:
        raise ProtocolError(where, "must carry a timezone (UTC)")
    return parsed.astimezone(UTC)
