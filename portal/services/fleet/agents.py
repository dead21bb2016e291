"""What node agents ask of the portal: parse their messages, register, desired state, events.

Messages are parsed with agents/protocol.py, the one schema of the wire protocol (types, bounds
matching what the database stores, no NaN, no NUL), read strictly (no unknown fields). A bad
message is refused whole (400 naming the field) before any write.
"""

import ipaddress
import json
import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from agents import protocol
from agents.protocol import (
    Event,
    EventsRequest,
    RegisterRequest,
    RegisterResponse,
)
from portal.errors import NotAllowed, ValidationFailed
from portal.models import Allocation, Booking, Gpu, MigInstance, Node
from portal.services.booking import events as booking_events
from portal.services.booking.bookings import booking_stop, booking_transition
from portal.services.booking.sessions import session_event_apply
from portal.services.core.jobs import job_enqueue
from portal.services.fleet.alerts import node_alert_record
from portal.services.fleet.mig_layouts import mig_changes_reported
from portal.services.fleet.nodes import (
    node_check_hostname,
    node_inventory_update,
    node_resources_settle,
)
from portal.services.fleet.runs import (
    agent_desired_dispatch,
    booking_is_multi_node,
    gang_outcome,
    node_run_end,
    node_run_output,
    node_run_started,
)
from portal.services.fleet.selectors import booking_node_places
from portal.services.fleet.telemetry import node_device_uuids, node_devices_forget
from portal.services.realtime import live

log = logging.getLogger(__name__)

ALERT_KINDS = {"foreign_process", "unbooked_process"}
SESSION_KINDS = {"started", "session_ready", "exited", "stopped"}


# -- parsing -------------------------------------------------------------------------------


def agent_message_parse(cls: type, body: bytes):
    """Parse and validate an agent's JSON body into protocol message `cls`, or raise 400.

    The one schema is agents/protocol.py (types, bounds, no NUL); the portal reads strictly:
    unknown fields are refused too.
    """
    try:
        data = json.loads(body or b"null", parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise ValidationFailed.field("body", f"not valid JSON: {exc}") from None
    try:
        message = protocol.from_json(cls, data, strict=True)
    except protocol.ProtocolError as exc:
        raise ValidationFailed.field(exc.field, exc.reason) from None
    _check_times(message, now=timezone.now())
    return message


def _check_times(message, *, now: datetime) -> None:
    """Refuse a reading's or an event's time more than AGENT_CLOCK_SKEW_S ahead of the portal's
    clock: a year-9999 reading would outlive every retention and stand as the latest forever."""
    stamped = []
    if isinstance(message, protocol.ReadingsRequest):
        stamped = [("time", message.time)]
    elif isinstance(message, protocol.EventsRequest):
        stamped = [(f"events[{i}].time", e.time) for i, e in enumerate(message.events)]
    ahead = timedelta(seconds=settings.AGENT_CLOCK_SKEW_S)
    for where, when in stamped:
        if when > now + ahead:
            raise ValidationFailed.field(
                where, f"is more than {ahead.total_seconds():g} s ahead of the portal's clock"
            )


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


# -- register ------------------------------------------------------------------------------


def agent_register(
    *, node: Node, request: RegisterRequest, address: str | None = None
) -> RegisterResponse:
    """Take the node's discovered inventory (GPUs, MIG instances) and answer its settings.
    `address` (the client address it registered from) is where its sessions are reached."""
    node_check_hostname(node=node, hostname=request.hostname)
    if request.protocol != protocol.PROTOCOL_VERSION:
        raise ValidationFailed.field(
            "protocol", f"this portal speaks protocol {protocol.PROTOCOL_VERSION}"
        )
    _check_devices_unique(request)
    _check_devices_not_elsewhere(node, request)
    with transaction.atomic():
        node_inventory_update(node=node, gpus=[protocol.to_json(g) for g in request.gpus])
        runtimes = [r for r in protocol.CONTAINER_RUNTIMES if r in request.container_runtimes]
        Node.objects.filter(pk=node.pk).update(
            agent_version=request.agent_version,
            address=request.address or "",
            container_runtimes=",".join(runtimes),
            registered_from=_ip_or_none(address),
            cpus=request.cpus,
            memory_mib=request.memory_mib,
        )
        node_resources_settle(node_id=node.pk, now=timezone.now())
        mig_changes_reported(node=node, results=request.mig_changes, now=timezone.now())
        booking_events.node_changed(node_id=node.pk, change="registered")  # devices may differ
    node_devices_forget(node_id=node.pk)
    return RegisterResponse(
        node=node.hostname,
        report_interval_s=settings.AGENT_REPORT_INTERVAL_S,
        sync_interval_s=settings.AGENT_SYNC_INTERVAL_S,
        enforcement=settings.AGENT_ENFORCEMENT,
    )


def _ip_or_none(address: str | None) -> str | None:
    try:
        return str(ipaddress.ip_address(address or ""))
    except ValueError:
        return None


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
    # A token must not let one node take over another node's live devices by naming their
    # UUIDs. A device retired on another node may move here (a card moved between servers).
    where = dict(_device_uuid_fields(request))
    gpus = Gpu.objects.filter(uuid__in=where, retired_at__isnull=True).exclude(node=node)
    migs = MigInstance.objects.filter(uuid__in=where, retired_at__isnull=True)
    gpus, migs = gpus.order_by(), migs.exclude(gpu__node=node).order_by()
    taken = gpus.values_list("uuid", flat=True).union(migs.values_list("uuid", flat=True))
    uuid = min(taken, default=None)
    if uuid is not None:
        raise NotAllowed(
            f"Device {uuid} belongs to another node.",
            fields={where[uuid]: "a device of another node"},
        )


# -- desired state -------------------------------------------------------------------------


def booking_fact_push(fact) -> None:
    """Subscriber: nudge the agents of the nodes a changed booking holds (or held) devices on."""
    desired_push(
        node_ids=Allocation.objects.filter(booking_id=fact.booking_id).values_list(
            "gpu__node_id", flat=True
        )
    )


def mig_fact_push(fact) -> None:
    """Subscriber: a MIG layout change moved on; its node's agent may have one to apply."""
    desired_push(node_ids=[fact.node_id])


def desired_push(*, node_ids) -> None:
    """Tell these nodes' agents (websocket group) their desired state changed. After commit only."""
    for node_id in sorted(set(node_ids)):
        generation = agent_desired_dispatch(node_id=node_id).generation
        live.group_send(
            live.agent_group(node_id), {"type": "desired.changed", "generation": generation}
        )


# -- events --------------------------------------------------------------------------------


def agent_events_record(*, node: Node, request: EventsRequest) -> int:
    """Apply a batch of agent events in one transaction, after checking them all.

    exited ends a batch booking (exit 0: finished, else failed) with its exit code and log tail;
    memory_exceeded fails the booking whose job its agent stops for going over its memory share;
    output stores a running job's log tail and sends it to the owner's pages after commit;
    started and stopped are logged; foreign_process / unbooked_process become NodeAlert rows,
    one per process (a repeat counts on its row), and a new one notifies the booking owner and
    the site after commit.
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
    if event.kind in SESSION_KINDS:
        session_event_apply(event=event, node=node)
    if event.kind == "session_ready":
        return
    if event.kind == "started":
        # Only for a running booking: a requeued one waits, its old run's news is stale.
        Booking.objects.filter(
            pk=event.booking_id, state=Booking.State.ACTIVE, started_at__isnull=True
        ).update(started_at=event.time)
        node_run_started(booking_id=event.booking_id, node_id=node.pk, when=event.time)
    elif event.kind in ("exited", "stopped"):
        _record_exit(node, event, min(event.time, now))
    elif event.kind == "memory_exceeded":
        _record_over_share(node, event, min(event.time, now))
    elif event.kind == "output":
        _record_output(node, event)
    else:
        _alert(node, event, now)


def _record_output(node: Node, event: Event) -> None:
    # Only the node running the booking now may write its output, and at most once per
    # BOOKING_OUTPUT_MIN_INTERVAL_S (a cache key as the clock): the final tail comes with the exit.
    if event.log_tail is None:
        return
    running_here = Allocation.objects.filter(
        booking_id=event.booking_id,
        live=True,
        gpu__node=node,
        booking__state=Booking.State.ACTIVE,
    ).exists()
    throttle = f"booking-output:{event.booking_id}:{node.pk}"
    if not running_here or not cache.add(throttle, 1, settings.BOOKING_OUTPUT_MIN_INTERVAL_S):
        return
    node_run_output(booking_id=event.booking_id, node_id=node.pk, log_tail=event.log_tail)
    booking = Booking.objects.get(pk=event.booking_id)
    if booking_is_multi_node(booking) and not _is_rank0(booking, node):
        return  # the booking shows rank 0's output; each node's is on its run
    Booking.objects.filter(pk=event.booking_id).update(log_tail=event.log_tail)
    owner_id = Booking.objects.values_list("owner_id", flat=True).get(pk=event.booking_id)
    transaction.on_commit(
        lambda: live.booking_output_broadcast(
            booking_id=event.booking_id, owner_id=owner_id, log_tail=event.log_tail
        ),
        robust=True,
    )


def _record_exit(node: Node, event: Event, when: datetime) -> None:
    # A job left over on a node that came back must not end the booking's new run elsewhere
    # (it was requeued and started again): only the node holding it now has a say.
    held_here = Allocation.objects.filter(
        booking_id=event.booking_id, live=True, gpu__node=node
    ).exists()
    booking = Booking.objects.get(pk=event.booking_id)
    if booking.state in (Booking.State.ACTIVE, Booking.State.PENDING) and not held_here:
        # Requeued: pending again, or already running elsewhere; the old run's exit is no news.
        log.info("ignoring %s of booking %s: it was requeued", event.kind, booking.pk)
        return
    run = node_run_end(booking=booking, node_id=node.pk, event=event, when=when)
    interrupted = _interruption(event)
    if interrupted is not None and booking.command and booking.state == Booking.State.ACTIVE:
        _record_interrupted(booking, node, interrupted, when)
        return
    if booking_is_multi_node(booking):
        _record_gang_exit(booking, run, event, when)
        return
    fields = {"log_tail": event.log_tail, "exit_code": event.exit_code}
    fields = {name: value for name, value in fields.items() if value is not None}
    if fields:
        Booking.objects.filter(pk=event.booking_id).update(**fields)
    if event.kind != "exited" or not booking.command:
        return
    to, what, detail = _outcome(event)
    if booking_transition(booking.pk, to=to, now=when, detail=detail[:300]):
        booking_events.booking_changed(booking, what)


def _record_over_share(node: Node, event: Event, when: datetime) -> None:
    """The node's agent is stopping a job for keeping more GPU memory than its share of a shared
    GPU (agents/memshare.py): the booking fails with the agent's reason, never requeued (it would
    do the same again), and its owner is told (the failed notice, after commit). The job's
    `stopped` event that follows brings its output."""
    held_here = Allocation.objects.filter(
        booking_id=event.booking_id, live=True, gpu__node=node
    ).exists()
    booking = Booking.objects.get(pk=event.booking_id)
    if booking.state != Booking.State.ACTIVE or not held_here:
        return  # ended already, or requeued and running elsewhere: this stop is no news
    reason = f"stopped by the agent: it {event.detail} (node {node.hostname})"
    if booking_transition(booking.pk, to=Booking.State.FAILED, now=when, detail=reason[:300]):
        booking_events.booking_changed(booking, "failed")


# Why a job that did not end by itself ended (Event.interrupted), as the booking says it.
INTERRUPTIONS = {
    "agent_stopped": "the node's agent stopped while it ran (node {node})",
    "unwatched": "it ended while the node's agent was not running, with no exit status (node {node})",
}


def _interruption(event: Event) -> str | None:
    """How the job ended without an end of its own (INTERRUPTIONS), or None: it exited (or was
    stopped by its agent for the booking's sake, or never launched)."""
    if event.interrupted is not None:
        return event.interrupted
    if event.kind == "exited" and event.exit_code is None and not _not_launched(event):
        return "unwatched"  # an agent older than exit files re-adopted it: no status either
    return None


def _not_launched(event: Event) -> bool:
    return event.detail.startswith("not launched")


def _record_interrupted(booking: Booking, node: Node, interrupted: str, when: datetime) -> None:
    """A batch job killed by its agent's stop, or gone with no exit status while no agent
    watched, is no success (and not the job's failure): its booking stops as after a node
    failure, requeued when it is a batch job with time left, failed otherwise. Every node's run
    of it ends so (the others lose it from their desired state)."""
    reason = INTERRUPTIONS[interrupted].format(node=node.hostname)
    booking_stop(booking_id=booking.pk, to=Booking.State.FAILED, now=when, detail=reason)


def _record_gang_exit(booking: Booking, run, event: Event, when: datetime) -> None:
    # Only the exit that decides writes the booking's exit code and output; a node stopped
    # after the booking ended has its say on its own run.
    if event.kind != "exited" or booking.state != Booking.State.ACTIVE:
        return
    outcome = gang_outcome(booking, run)
    if outcome is None:
        return
    to, what, detail = outcome
    if booking_transition(booking.pk, to=to, now=when, detail=detail[:300]):
        shown = (
            run
            if to == Booking.State.FAILED
            else booking.node_runs.filter(restart=booking.restart_count).order_by("rank").first()
        )
        Booking.objects.filter(pk=booking.pk).update(
            exit_code=run.exit_code if to == Booking.State.FAILED else 0,
            log_tail=shown.log_tail if shown else "",
        )
        booking_events.booking_changed(booking, what)


def _is_rank0(booking: Booking, node: Node) -> bool:
    nodes = booking_node_places(booking_ids=[booking.pk])[booking.pk]
    return bool(nodes) and nodes[0].node_id == node.pk


def _outcome(event: Event) -> tuple[str, str, str]:
    if event.oom_limit_mib is not None:
        # The job's own memory limit (its booking's host memory) stopped it: say so, not -9.
        code = "" if event.exit_code is None else f"; exit code {event.exit_code}"
        reason = protocol.oom_reason(event.oom_limit_mib)
        return Booking.State.FAILED, "failed", f"command was {reason}{code}"
    if event.exit_code == 0:
        return Booking.State.FINISHED, "finished", "command exited with code 0"
    if event.exit_code is not None:
        return Booking.State.FAILED, "failed", f"command exited with code {event.exit_code}"
    return Booking.State.FAILED, "failed", event.detail  # not launched (_interruption)


def _alert(node: Node, event: Event, now: datetime) -> None:
    booking = Booking.objects.filter(pk=event.booking_id).first() if event.booking_id else None
    seen = node_alert_record(
        node=node,
        kind=event.kind,
        time=event.time,
        now=now,
        booking=booking,
        device_uuid=event.device_uuid or "",
        pid=event.pid,
        user=event.user or "",
        action=event.action or "",
        detail=event.detail,
    )
    if not seen.new:
        return  # told already: a repeat counts on the alert's row
    # Coalesced: one message per node and kind per NODE_ALERT_COALESCE_S (a cache key as the
    # clock), so a flood of alerts sends a few messages; every process is still a row to read.
    gate = f"node-alert-notify:{node.pk}:{event.kind}"
    if cache.add(gate, 1, settings.NODE_ALERT_COALESCE_S):
        transaction.on_commit(lambda: job_enqueue("node_alert_notify", seen.alert_id), robust=True)
