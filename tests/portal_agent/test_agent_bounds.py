"""The protocol's bounds are the columns' bounds: whatever an agent may send fits where the
portal stores it, so a value out of range is a 400 naming the field, never a DataError (500)."""

import dataclasses
import json
import types
import typing
from datetime import datetime

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from agents import protocol
from portal.models import (
    Allocation,
    Booking,
    Gpu,
    MigInstance,
    MigLayoutChange,
    Node,
    NodeAlert,
    NodeRun,
    ProcessUsage,
    Sample,
)
from tests.conftest import error_of
from tests.portal_agent.conftest import reading

# Every bounded protocol field that lands in a column -> the column (model, field name). None
# marks a field the portal does not store as sent (a list, a time, a value it truncates or only
# compares), with why.
COLUMNS = {
    ("MigInventory", "uuid"): (MigInstance, "uuid"),
    ("MigInventory", "profile"): (MigInstance, "profile"),
    ("MigInventory", "slices"): (MigInstance, "slices"),
    ("MigInventory", "memory_total_mib"): (MigInstance, "memory_mib"),
    ("GpuInventory", "index"): (Gpu, "index"),
    ("GpuInventory", "uuid"): (Gpu, "uuid"),
    ("GpuInventory", "model"): (Gpu, "model"),
    ("GpuInventory", "memory_total_mib"): (Gpu, "memory_mib"),
    ("GpuInventory", "pci_bus_id"): (Gpu, "pci_bus_id"),
    ("GpuInventory", "numa_node"): (Gpu, "numa_node"),
    ("GpuInventory", "nvlink_peers"): None,  # indexes of other GPUs, in Gpu.nvlink_peers (JSON)
    ("RegisterRequest", "hostname"): (Node, "hostname"),
    ("RegisterRequest", "agent_version"): (Node, "agent_version"),
    ("RegisterRequest", "protocol"): None,  # compared to PROTOCOL_VERSION, not stored
    ("RegisterRequest", "address"): (Node, "address"),
    ("RegisterRequest", "container_runtimes"): None,  # stored as the known names among them
    ("ProcessReading", "pid"): (ProcessUsage, "pid"),
    ("ProcessReading", "user"): (ProcessUsage, "user"),
    ("ProcessReading", "used_memory_mib"): (ProcessUsage, "peak_memory_mib"),
    ("ProcessReading", "name"): None,  # stored cut to ProcessUsage.name's 64 characters
    ("DeviceReading", "uuid"): (Sample, "uuid"),
    ("DeviceReading", "utilization_gpu"): (Sample, "utilization_gpu"),
    ("DeviceReading", "utilization_memory"): (Sample, "utilization_memory"),
    ("DeviceReading", "memory_used_mib"): (Sample, "memory_used_mib"),
    ("DeviceReading", "memory_total_mib"): (Sample, "memory_total_mib"),
    ("DeviceReading", "temperature_c"): (Sample, "temperature_c"),
    ("DeviceReading", "power_w"): (Sample, "power_w"),
    ("DeviceReading", "energy_mj"): None,  # not stored (the portal integrates power_w)
    ("ReadingsRequest", "hostname"): (Node, "hostname"),
    ("DesiredBooking", "booking_id"): (Booking, "id"),
    ("DesiredBooking", "owner"): (get_user_model(), "username"),
    ("DesiredBooking", "device_uuids"): (Gpu, "uuid"),
    ("DesiredBooking", "command"): (Booking, "command"),
    ("DesiredBooking", "session_token"): (Booking, "session_token"),
    ("DesiredBooking", "workdir"): (Booking, "workdir"),
    ("DesiredBooking", "node_rank"): (NodeRun, "rank"),
    ("DesiredBooking", "master_port"): (Booking, "master_port"),
    ("DesiredBooking", "warn_before_s"): (Booking, "signal_before_s"),
    ("DesiredBooking", "kill_wait_s"): None,  # the site's JOB_KILL_WAIT_S, not stored
    ("DesiredBooking", "restart_count"): (Booking, "restart_count"),
    ("EnvVar", "name"): None,  # a key of Booking.env (JSON), bounded at submit
    ("EnvVar", "value"): None,  # a value of Booking.env (JSON), bounded at submit
    ("NodePlace", "hostname"): (Node, "hostname"),
    ("NodePlace", "address"): (Node, "address"),
    ("NodePlace", "slots"): None,  # a count of allocations, not stored
    ("DesiredBooking", "array_job_id"): (Booking, "id"),  # the array's first task
    ("DesiredBooking", "array_task_id"): (Booking, "array_task_id"),
    ("DesiredBooking", "image"): (Booking, "image"),
    ("ProcessReading", "booking_id"): (Booking, "id"),  # ProcessUsage.booking
    ("DesiredBooking", "gpu_fraction"): (Allocation, "share"),
    ("DesiredBooking", "gpu_memory_mib"): (Allocation, "gpu_memory_mib"),
    ("DesiredState", "generation"): None,  # the portal's own counter, read by the agent only
    ("Event", "detail"): (NodeAlert, "detail"),  # Booking.state_detail takes it cut to 300
    ("Event", "booking_id"): (Booking, "id"),
    ("Event", "exit_code"): (Booking, "exit_code"),
    ("Event", "log_tail"): (Booking, "log_tail"),
    ("Event", "device_uuid"): (NodeAlert, "device_uuid"),
    ("Event", "pid"): (NodeAlert, "pid"),
    ("Event", "user"): (NodeAlert, "user"),
    ("Event", "session_host"): (Booking, "session_host"),
    ("Event", "session_port"): (Booking, "session_port"),
    ("PushMessage", "generation"): None,  # as DesiredState.generation
    ("MigInventory", "placement_start"): (MigInstance, "placement_start"),
    ("MigChangeResult", "change_id"): (MigLayoutChange, "id"),
    ("MigChangeResult", "ok"): None,  # which state the change ends in
    ("MigChangeResult", "detail"): (MigLayoutChange, "detail"),
    ("MigSlot", "profile"): (MigInstance, "profile"),
    ("MigSlot", "start"): (MigInstance, "placement_start"),
    ("MigSlot", "slices"): (MigInstance, "slices"),
    ("MigSlot", "size"): None,  # scheduler.mig_layout's data, not stored
    ("MigSlot", "gi_profile"): None,  # likewise
    ("MigSlot", "memory_mib"): (MigInstance, "memory_mib"),
    ("DesiredMigLayout", "change_id"): (MigLayoutChange, "id"),
    ("DesiredMigLayout", "gpu_uuid"): (Gpu, "uuid"),
    ("RegisterRequest", "cpus"): (Node, "cpus"),
    ("RegisterRequest", "memory_mib"): (Node, "memory_mib"),
    ("NumaCpus", "numa_node"): None,  # the agent's own cpuset choice; the portal keeps none
    ("NumaCpus", "cpu_list"): None,
    # What the booking got on the node, sent to its agent; the allocator's rows hold it.
    ("DesiredBooking", "cpus"): None,
    ("DesiredBooking", "memory_mib"): None,
    ("DesiredBooking", "cpu_list"): None,
    ("Event", "oom_limit_mib"): None,  # said in Booking.state_detail, not stored as a number
}
MESSAGES = [
    protocol.MigInventory,
    protocol.GpuInventory,
    protocol.NumaCpus,
    protocol.RegisterRequest,
    protocol.ProcessReading,
    protocol.DeviceReading,
    protocol.ReadingsRequest,
    protocol.EnvVar,
    protocol.NodePlace,
    protocol.DesiredBooking,
    protocol.DesiredState,
    protocol.Event,
    protocol.EventsRequest,
    protocol.PushMessage,
    protocol.MigChangeResult,
    protocol.MigSlot,
    protocol.DesiredMigLayout,
]


def _scalar(hint):
    """The scalar type a field holds (list items, optional values), or None for a message."""
    for _ in range(3):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (list, typing.Union, types.UnionType):
            hint = args[0]
    if dataclasses.is_dataclass(hint) or typing.get_origin(hint) is typing.Literal:
        return None
    return hint


def _stored_fields():
    for cls in MESSAGES:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            scalar = _scalar(hints[f.name])
            if scalar in (None, bool, datetime):
                continue
            yield cls.__name__, f, scalar


def test_it_names_the_column_of_every_stored_protocol_field():
    missing = [(name, f.name) for name, f, _ in _stored_fields() if (name, f.name) not in COLUMNS]
    assert missing == []


@pytest.mark.parametrize(
    "message,field,scalar",
    [pytest.param(name, f, s, id=f"{name}.{f.name}") for name, f, s in _stored_fields()],
)
def test_it_bounds_every_protocol_field_by_the_column_it_lands_in(message, field, scalar):
    column = COLUMNS[(message, field.name)]
    if column is None:
        return
    model, name = column
    model_field = model._meta.get_field(name)
    limits = field.metadata.get("limits", protocol._NO_LIMITS)
    if scalar is str:
        if model_field.max_length is None:  # a text column: the protocol's own cap applies
            assert model_field.get_internal_type() == "TextField"
        else:
            assert limits["max_length"] == model_field.max_length
    elif scalar is int:
        low, high = connection.ops.integer_field_range(model_field.get_internal_type())
        sent_low = max(limits["ints"][0], limits["low"] if limits["low"] is not None else -(2**63))
        sent_high = min(limits["ints"][1], limits["high"] if limits["high"] is not None else 2**63)
        assert low <= sent_low and sent_high <= high, (sent_low, sent_high, low, high)
    else:
        assert scalar is float and model_field.get_internal_type() == "FloatField"


@pytest.mark.django_db
def test_it_refuses_a_gpu_index_beyond_the_column_with_400_and_writes_nothing(node_a, agent_a):
    from tests.portal_agent.test_agent_api import REGISTER

    before = sorted(Gpu.objects.values_list("uuid", "index"))
    body = json.loads(json.dumps(REGISTER))
    body["gpus"][0]["index"] = 40000
    response = agent_a.post(protocol.REGISTER_PATH, body)
    assert response.status_code == 400
    assert error_of(response)["fields"] == {"gpus[0].index": "must be at most 32767"}
    assert sorted(Gpu.objects.values_list("uuid", "index")) == before
    assert not MigInstance.objects.filter(uuid__startswith="MIG-new").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("time", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_it_refuses_a_time_that_has_no_utc_equivalent_with_400(node_a, agent_a, time):
    uuid = node_a[0].gpus.first().uuid
    response = agent_a.readings("node-a", [reading(uuid)], time=time)
    assert response.status_code == 400
    assert list(error_of(response)["fields"]) == ["time"]
    assert not Sample.objects.exists()
