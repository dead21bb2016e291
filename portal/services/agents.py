"""What node agents ask of the portal: parse their messages, register, desired state, events.

Messages are parsed with agents/protocol.py (the one definition of the wire protocol) plus the
portal's stricter checks: no unknown fields, no NaN or infinities, numbers and strings within
what the database stores. A bad message is refused whole (400 naming the field) before any write.
"""

import dataclasses
import functools
import hashlib
import json
import logging
import math
import types
import typing
from datetime import datetime

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from agents import protocol
from agents.protocol import (
    DesiredBooking,
    DesiredState,
    Event,
    EventsRequest,
    RegisterRequest,
    RegisterResponse,
)
from portal.errors import NotAllowed, ValidationFailed
from portal.models import Allocation, Booking, Gpu, MigInstance, Node, NodeAlert
from portal.models.inventory import MIG_SLICES_PER_GPU
from portal.services import events as booking_events
from portal.services import live
from portal.services.bookings import booking_transition
from portal.services.nodes import node_check_hostname, node_inventory_update
from portal.services.notifications import slack_post
from portal.services.telemetry import node_device_uuids, node_devices_forget

log = logging.getLogger(__name__)

_INT_RANGE = (-(2**31), 2**31 - 1)  # what an IntegerField holds
_BIG_INTS = {"booking_id"}  # primary keys are 64-bit
_FLOAT_LIMIT = 1e9
# Strings the portal stores are held to their columns' lengths, read from the models.
_STRING_LIMITS = {
    "uuid": Gpu._meta.get_field("uuid").max_length,
    "device_uuid": Gpu._meta.get_field("uuid").max_length,
    "hostname": Node._meta.get_field("hostname").max_length,
    "user": 64,
    "model": Gpu._meta.get_field("model").max_length,
    "profile": MigInstance._meta.get_field("profile").max_length,
    "agent_version": Node._meta.get_field("agent_version").max_length,
}
_STRING_LIMIT = 65536
_PERCENT = {"utilization_gpu", "utilization_memory"}
_NON_NEGATIVE = {
    "memory_used_mib",
    "memory_total_mib",
    "used_memory_mib",
    "pid",
    "index",
    "slices",
    "booking_id",
    "power_w",
}
_RANGES = {"slices": (1, MIG_SLICES_PER_GPU)}  # a MIG instance holds 1..7 compute slices
ALERT_KINDS = {"foreign_process", "unbooked_process"}


# -- parsing -------------------------------------------------------------------------------


def agent_message_parse(cls: type, body: bytes):
    """Parse and validate an agent's JSON body into protocol message `cls`, or raise 400."""
    try:
        data = json.loads(body or b"null", parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise ValidationFailed.field("body", f"not valid JSON: {exc}") from None
    try:
        _check_unknown(cls, data, "")
        message = protocol.from_json(cls, data)
    except protocol.ProtocolError as exc:
        raise ValidationFailed.field(exc.field, exc.reason) from None
    _check_limits(message, "")
    return message


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _check_unknown(cls: type, data, path: str) -> None:
    # protocol.from_json ignores unknown fields; the portal refuses them (a typo loses data).
    if not isinstance(data, dict):
        return
    hints = _hints(cls)
    for key in data:
        where = f"{path}.{key}" if path else str(key)
        if key not in hints:
            raise protocol.ProtocolError(where, "is not a field of this message")
        inner = _dataclass_in(hints[key])
        if inner is None:
            continue
        items = data[key] if isinstance(data[key], list) else [data[key]]
        suffix = isinstance(data[key], list)
        for i, item in enumerate(items):
            _check_unknown(inner, item, f"{where}[{i}]" if suffix else where)


@functools.cache
def _hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


@functools.cache
def _dataclass_in(hint) -> type | None:
    if dataclasses.is_dataclass(hint):
        return hint
    if typing.get_origin(hint) in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            found = _dataclass_in(arg)
            if found is not None:
                return found
    return None


def _check_limits(value, path: str, name: str = "") -> None:
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            where = f"{path}.{f.name}" if path else f.name
            _check_limits(getattr(value, f.name), where, f.name)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_limits(item, f"{path}[{i}]", name)
    elif isinstance(value, bool) or value is None or isinstance(value, datetime):
        return
    elif isinstance(value, int | float):
        _check_number(value, path, name)
    elif isinstance(value, str):
        _check_string(value, path, name)


def _check_string(value: str, path: str, name: str) -> None:
    limit = _STRING_LIMITS.get(name, _STRING_LIMIT)
    if len(value) > limit:
        raise ValidationFailed.field(path, f"longer than {limit} characters")
    if "\x00" in value:  # PostgreSQL text cannot hold NUL
        raise ValidationFailed.field(path, "must not contain NUL characters")


def _check_number(value: float, path: str, name: str) -> None:
    low, high = (-(2**63), 2**63 - 1) if name in _BIG_INTS else _INT_RANGE
    if isinstance(value, int) and not low <= value <= high:
        raise ValidationFailed.field(path, "is out of range")
    if isinstance(value, float) and (not math.isfinite(value) or abs(value) > _FLOAT_LIMIT):
        raise ValidationFailed.field(path, "is out of range")
    if name in _PERCENT and not 0 <= value <= 100:
        raise ValidationFailed.field(path, "must be a percentage between 0 and 100")
    if name in _NON_NEGATIVE and value < 0:
        raise ValidationFailed.field(path, "must not be negative")
    if name in _RANGES and not _RANGES[name][0] <= value <= _RANGES[name][1]:
        low, high = _RANGES[name]
        raise ValidationFailed.field(path, f"must be between {low} and {high}")


# -- register ------------------------------------------------------------------------------


def agent_register(*, node: Node, request: RegisterRequest) -> RegisterResponse:
    """Take the node's discovered inventory (GPUs, MIG instances) and answer its settings."""
    node_check_hostname(node=node, hostname=request.hostname)
    if request.protocol != protocol.PROTOCOL_VERSION:
        raise ValidationFailed.field(
            "protocol", f"this portal speaks protocol {protocol.PROTOCOL_VERSION}"
        )
    _check_devices_unique(request)
    _check_devices_not_elsewhere(node, request)
    with transaction.atomic():
        node_inventory_update(node=node, gpus=[protocol.to_json(g) for g in request.gpus])
        Node.objects.filter(pk=node.pk).update(agent_version=request.agent_version)
        booking_events.request_allocation_pass()  # the inventory may have grown
    node_devices_forget(node_id=node.pk)
    return RegisterResponse(
        node=node.hostname,
        report_interval_s=settings.AGENT_REPORT_INTERVAL_S,
        sync_interval_s=settings.AGENT_SYNC_INTERVAL_S,
        enforcement=settings.AGENT_ENFORCEMENT,
    )


def _device_uuid_fields(request: RegisterRequest) -> list[tuple[str, str]]:
    """(uuid, field path) of every GPU and MIG instance in a register, in message order."""
    found = []
    for i, gpu in enumerate(request.gpus):
        found.append((gpu.uuid, f"gpus[{i}].uuid"))
        for j, mig in enumerate(gpu.mig_instances):
            found.append((mig.uuid, f"gpus[{i}].mig_instances[{j}].uuid"))
    return found


def _check_devices_unique(request: RegisterRequest) -> None:
    seen: dict[str, str] = {}
    for uuid, where in _device_uuid_fields(request):
        if uuid in seen:
            raise ValidationFailed.field(where, f"the same UUID as {seen[uuid]}")
        seen[uuid] = where


def _check_devices_not_elsewhere(node: Node, request: RegisterRequest) -> None:
    # A token must not let one node take over another node's devices by naming their UUIDs.
    where = dict(_device_uuid_fields(request))
    gpus = Gpu.objects.filter(uuid__in=where).exclude(node=node).order_by()
    migs = MigInstance.objects.filter(uuid__in=where).exclude(gpu__node=node).order_by()
    taken = gpus.values_list("uuid", flat=True).union(migs.values_list("uuid", flat=True))
    uuid = min(taken, default=None)
    if uuid is not None:
        raise NotAllowed(
            f"Device {uuid} belongs to another node.",
            fields={where[uuid]: "a device of another node"},
        )


# -- desired state -------------------------------------------------------------------------


def agent_desired(*, node_id: int) -> DesiredState:
    """The active bookings holding the node's devices, with a generation that changes with them.

    The generation is a hash of the content, so it changes exactly when what the agent must do
    changes, needs no stored counter, and the push (desired_push) can quote the same number.
    """
    bookings = _desired_bookings(node_id)
    encoded = json.dumps([protocol.to_json(b) for b in bookings], sort_keys=True)
    generation = int(hashlib.sha256(encoded.encode()).hexdigest()[:13], 16)  # < 2**53: JSON-safe
    return DesiredState(generation=generation, bookings=bookings)


def _desired_bookings(node_id: int) -> list[DesiredBooking]:
    allocations = (
        Allocation.objects.filter(
            live=True, gpu__node_id=node_id, booking__state=Booking.State.ACTIVE
        )
        .select_related("booking__owner", "gpu", "mig_instance")
        .order_by("booking_id", "id")
    )
    grouped: dict[int, list[Allocation]] = {}
    for allocation in allocations:
        grouped.setdefault(allocation.booking_id, []).append(allocation)
    return [
        DesiredBooking(
            booking_id=booking_id,
            owner=held[0].booking.owner.username,
            device_uuids=[a.device_uuid for a in held],
            start=min(a.start for a in held),
            end=max(a.end for a in held),
            command=held[0].booking.command or None,
        )
        for booking_id, held in grouped.items()
    ]


def desired_push(*, node_ids) -> None:
    """Tell these nodes' agents (websocket group) their desired state changed. After commit only."""
    for node_id in sorted(set(node_ids)):
        generation = agent_desired(node_id=node_id).generation
        live.group_send(
            live.agent_group(node_id), {"type": "desired.changed", "generation": generation}
        )


# -- events --------------------------------------------------------------------------------


def agent_events_record(*, node: Node, request: EventsRequest) -> int:
    """Apply a batch of agent events in one transaction, after checking them all.

    exited ends a batch booking (exit 0: finished, else failed) with its exit code and log tail;
    started and stopped are logged; foreign_process / unbooked_process become NodeAlert rows
    and notify the booking owner and the site after commit.
    """
    _check_events(node, request.events)
    now = timezone.now()
    with transaction.atomic():
        for event in request.events:
            _apply(node, event, now)
    return len(request.events)


def _check_events(node: Node, batch: list[Event]) -> None:
    ids = {e.booking_id for e in batch if e.booking_id is not None}
    mine = set(
        Allocation.objects.filter(booking_id__in=ids, gpu__node=node).values_list(
            "booking_id", flat=True
        )
    )
    devices = node_device_uuids(node_id=node.pk)
    for i, event in enumerate(batch):
        if event.kind not in ALERT_KINDS and event.booking_id is None:
            raise ValidationFailed.field(f"events[{i}].booking_id", f"is required for {event.kind}")
        if event.booking_id is not None and event.booking_id not in mine:
            raise NotAllowed(
                f"Booking {event.booking_id} holds no device of {node.hostname}.",
                fields={f"events[{i}].booking_id": "not a booking on this node"},
            )
        if event.device_uuid is not None and event.device_uuid not in devices:
            raise ValidationFailed.field(
                f"events[{i}].device_uuid", f"{event.device_uuid} is not a device of this node"
            )


def _apply(node: Node, event: Event, now: datetime) -> None:
    log.info("agent %s: %s booking=%s: %s", node, event.kind, event.booking_id, event.detail)
    if event.kind == "started":
        Booking.objects.filter(pk=event.booking_id, started_at__isnull=True).update(
            started_at=event.time
        )
    elif event.kind in ("exited", "stopped"):
        _record_exit(node, event, min(event.time, now))
    else:
        _alert(node, event)


def _record_exit(node: Node, event: Event, when: datetime) -> None:
    # A job left over on a node that came back must not end the booking's new run elsewhere
    # (it was requeued and started again): only the node holding it now has a say.
    held_here = Allocation.objects.filter(
        booking_id=event.booking_id, live=True, gpu__node=node
    ).exists()
    booking = Booking.objects.get(pk=event.booking_id)
    if booking.state == Booking.State.ACTIVE and not held_here:
        log.info("ignoring %s of booking %s: it runs elsewhere now", event.kind, booking.pk)
        return
    fields = {"log_tail": event.log_tail, "exit_code": event.exit_code}
    fields = {name: value for name, value in fields.items() if value is not None}
    if fields:
        Booking.objects.filter(pk=event.booking_id).update(**fields)
    if event.kind != "exited" or not booking.command:
        return
    to, what, detail = _outcome(event)
    if booking_transition(
        booking.pk, from_states=(Booking.State.ACTIVE,), to=to, now=when, detail=detail[:300]
    ):
        booking_events.booking_changed(booking, what)


def _outcome(event: Event) -> tuple[str, str, str]:
    if event.exit_code == 0:
        return Booking.State.FINISHED, "finished", "command exited with code 0"
    if event.exit_code is not None:
        return Booking.State.FAILED, "failed", f"command exited with code {event.exit_code}"
    if event.detail.startswith("not launched"):
        return Booking.State.FAILED, "failed", event.detail
    # A job re-adopted after an agent restart is no child of the agent: its status is unknown.
    return Booking.State.FINISHED, "finished", f"command ended, exit code unknown ({event.detail})"


def _alert(node: Node, event: Event) -> None:
    booking = Booking.objects.filter(pk=event.booking_id).first() if event.booking_id else None
    alert = NodeAlert.objects.create(
        node=node,
        kind=event.kind,
        time=event.time,
        device_uuid=event.device_uuid or "",
        pid=event.pid,
        user=event.user or "",
        action=event.action or "",
        detail=event.detail,
        booking=booking,
        owner_id=booking.owner_id if booking else None,
    )
    from portal import tasks

    transaction.on_commit(lambda: tasks.node_alert_notify.delay(alert.pk), robust=True)


def node_alert_notify(*, alert_id: int) -> None:
    """Email the owner of the booking a process intruded on, and post to the site's Slack."""
    alert = NodeAlert.objects.select_related("node", "owner").filter(pk=alert_id).first()
    if alert is None:
        return
    subject = f"GPU alert on {alert.node}: {alert.get_kind_display()}"
    body = f"{alert.detail}\n\nAction taken by the agent: {alert.action or 'report'}.\n"
    if alert.owner and alert.owner.email:
        send_mail(
            subject, body, settings.DEFAULT_FROM_EMAIL, [alert.owner.email], fail_silently=True
        )
    slack_post(f"{subject}: {alert.detail}")
