"""The wire protocol: round trips and validation errors that name the field."""

import json
from datetime import UTC, datetime

import pytest

from agents.protocol import (
    ADDRESS_RULE,
    HOSTNAME_RULE,
    AcceptedResponse,
    DesiredBooking,
    DesiredState,
    DeviceReading,
    Event,
    EventsRequest,
    GpuInventory,
    MigInventory,
    ProcessReading,
    ProtocolError,
    PushMessage,
    ReadingsRequest,
    RegisterRequest,
    RegisterResponse,
    dumps,
    from_json,
    to_json,
)

T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)

MESSAGES = [
    RegisterRequest(
        "node1",
        "0.1.0",
        [
            GpuInventory(0, "GPU-a", "NVIDIA H100", 81920, False),
            GpuInventory(
                1, "GPU-b", "NVIDIA A100", 81920, True, [MigInventory("MIG-c", "3g.40gb", 3, 40960)]
            ),
        ],
    ),
    RegisterResponse("node1", 5.0, 30.0, "warn"),
    ReadingsRequest(
        "node1",
        T0,
        [
            DeviceReading(
                "GPU-a",
                12.5,
                3.0,
                1024,
                81920,
                41.0,
                250.5,
                [ProcessReading(7, "ann", 1024, "python")],
            ),
            DeviceReading("MIG-c", None, None, 0, 40960, None, None, []),
        ],
    ),
    DesiredState(3, [DesiredBooking(9, "ann", ["GPU-a", "MIG-c"], T0, T1, "python train.py")]),
    EventsRequest(
        [
            Event(
                "exited",
                T0,
                "exited",
                booking_id=9,
                exit_code=3,
                log_tail="hi\n",
                pid=77,
                user="ann",
            ),
            Event(
                "foreign_process", T0, "x", 9, device_uuid="GPU-a", pid=8, user="bob", action="kill"
            ),
        ]
    ),
    PushMessage("desired_changed", 4),
    AcceptedResponse(2),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_it_round_trips_every_message_through_json_text(message):
    text = dumps(message)
    assert from_json(type(message), text) == message
    assert from_json(type(message), json.loads(text)) == message


def test_it_writes_times_as_iso_utc_and_nulls_as_null():
    body = to_json(MESSAGES[2])
    assert body["time"] == "2026-11-30T08:00:00Z"
    assert body["readings"][1]["utilization_gpu"] is None
    assert body["readings"][0]["processes"][0] == {
        "pid": 7,
        "user": "ann",
        "used_memory_mib": 1024,
        "name": "python",
        "booking_id": None,  # the agent launched no job it is part of
    }


def _register_body():
    return to_json(MESSAGES[0])


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (lambda b: b.pop("hostname"), "hostname", "is required"),
        (
            lambda b: b["gpus"][1]["mig_instances"][0].pop("uuid"),
            "gpus[1].mig_instances[0].uuid",
            "is required",
        ),
        (lambda b: b["gpus"][0].update(index="0"), "gpus[0].index", "must be an integer"),
        (lambda b: b["gpus"][0].update(index=True), "gpus[0].index", "must be an integer"),
        (lambda b: b["gpus"][0].update(mig_mode=1), "gpus[0].mig_mode", "must be a boolean"),
        (lambda b: b["gpus"][0].update(uuid=None), "gpus[0].uuid", "must not be null"),
        (lambda b: b.update(gpus={}), "gpus", "must be a list"),
        (lambda b: b["gpus"].append("x"), "gpus[2]", "must be an object"),
    ],
)
def test_it_names_the_bad_field_in_a_register(mutate, field, reason):
    body = _register_body()
    mutate(body)
    with pytest.raises(ProtocolError) as caught:
        from_json(RegisterRequest, body)
    assert caught.value.field == field
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("mutate", "field", "reason"),
    [
        (
            lambda b: b["gpus"][1]["mig_instances"][0].update(profile="p" * 33),
            "gpus[1].mig_instances[0].profile",
            "longer than 32 characters",
        ),
        (lambda b: b.update(agent_version="v" * 65), "agent_version", "longer than 64 characters"),
        (
            lambda b: b["gpus"][0].update(model="H100\x00"),
            "gpus[0].model",
            "must not contain NUL characters",
        ),
        (
            lambda b: b["gpus"][1]["mig_instances"][0].update(slices=0),
            "gpus[1].mig_instances[0].slices",
            "must be between 1 and 7",
        ),
        (lambda b: b["gpus"][0].update(index=-1), "gpus[0].index", "must not be negative"),
        (lambda b: b["gpus"][0].update(index=2**40), "gpus[0].index", "must be at most 32767"),
        (lambda b: b["gpus"][0].update(index=40000), "gpus[0].index", "must be at most 32767"),
        (
            lambda b: b["gpus"][0].update(memory_total_mib=2**31),
            "gpus[0].memory_total_mib",
            "must be at most 2147483647",
        ),
        (
            lambda b: b["gpus"][0].update(nvlink_peers=[1, -1]),
            "gpus[0].nvlink_peers[1]",
            "must be between 0 and 63",
        ),
        (
            lambda b: b["gpus"][0].update(nvlink_peers=[64]),
            "gpus[0].nvlink_peers[0]",
            "must be between 0 and 63",
        ),
        (
            lambda b: b["gpus"][0].update(nvlink_peers=["1"]),
            "gpus[0].nvlink_peers[0]",
            "must be an integer",
        ),
        (
            lambda b: b["gpus"][0].update(nvlink_peers=list(range(64)) * 2),
            "gpus[0].nvlink_peers",
            "has 128 items; at most 64 per request",
        ),
        (
            lambda b: b["gpus"][0].update(numa_node=1024),
            "gpus[0].numa_node",
            "must be between 0 and 1023",
        ),
        (
            lambda b: b["gpus"][0].update(pci_bus_id="0000:3b:00.0\n"),
            "gpus[0].pci_bus_id",
            "must not contain control characters",
        ),
        (
            lambda b: b["gpus"][0].update(pci_bus_id="0" * 33),
            "gpus[0].pci_bus_id",
            "longer than 32 characters",
        ),
    ],
)
def test_it_holds_both_sides_to_the_schemas_bounds(mutate, field, reason):
    body = _register_body()
    mutate(body)
    with pytest.raises(ProtocolError) as caught:
        from_json(RegisterRequest, body)
    assert (caught.value.field, caught.value.reason) == (field, reason)


def test_it_refuses_unknown_fields_only_when_strict():
    body = _register_body()
    body["gpus"][0]["colour"] = "green"
    assert from_json(RegisterRequest, body).gpus[0].uuid == body["gpus"][0]["uuid"]
    with pytest.raises(ProtocolError) as caught:
        from_json(RegisterRequest, body, strict=True)
    assert (caught.value.field, caught.value.reason) == (
        "gpus[0].colour",
        "is not a field of this message",
    )


def test_it_rejects_unknown_enforcement_and_event_kinds():
    with pytest.raises(ProtocolError) as caught:
        from_json(
            RegisterResponse,
            {"node": "n", "report_interval_s": 5, "sync_interval_s": 30, "enforcement": "nuke"},
        )
    assert caught.value.field == "enforcement"
    body = to_json(MESSAGES[4])
    body["events"][1]["kind"] = "exploded"
    with pytest.raises(ProtocolError) as caught:
        from_json(EventsRequest, body)
    assert caught.value.field == "events[1].kind"


def test_it_requires_timezone_aware_times():
    body = to_json(MESSAGES[3])
    body["bookings"][0]["end"] = "2026-11-30T10:00:00"
    with pytest.raises(ProtocolError, match="bookings\\[0\\].end: must carry a timezone"):
        from_json(DesiredState, body)
    body["bookings"][0]["end"] = "tomorrow"
    with pytest.raises(ProtocolError, match="bookings\\[0\\].end: must be an ISO-8601 string"):
        from_json(DesiredState, body)


def test_it_reports_non_json_bodies():
    with pytest.raises(ProtocolError) as caught:
        from_json(EventsRequest, b"{nope")
    assert caught.value.field == "body"


def test_it_accepts_integers_for_floats_and_omitted_optionals():
    answer = from_json(
        RegisterResponse,
        {"node": "n", "report_interval_s": 5, "sync_interval_s": 30, "enforcement": "kill"},
    )
    assert answer.report_interval_s == 5.0 and isinstance(answer.report_interval_s, float)
    event = from_json(Event, {"kind": "started", "time": "2026-11-30T08:00:00+01:00"})
    assert event.booking_id is None and event.detail == ""
    assert event.time == datetime(2026, 11, 30, 7, 0, tzinfo=UTC)


def test_a_register_without_topology_still_parses():
    body = _register_body()
    for gpu in body["gpus"]:
        for name in ("pci_bus_id", "numa_node", "nvlink_peers"):
            gpu.pop(name)
    message = from_json(RegisterRequest, body, strict=True)
    assert (message.gpus[0].nvlink_peers, message.gpus[0].numa_node) == ([], None)


@pytest.mark.parametrize(
    ("place", "field", "reason"),
    [
        ({"address": "10.9.9.9 --nproc-per-node=999"}, "nodes[0].address", ADDRESS_RULE),
        ({"address": "$(reboot)"}, "nodes[0].address", ADDRESS_RULE),
        ({"hostname": "evil slots=99"}, "nodes[0].hostname", HOSTNAME_RULE),
        ({"hostname": "gpu-.example"}, "nodes[0].hostname", HOSTNAME_RULE),
    ],
)
def test_it_takes_no_node_place_whose_name_or_address_is_no_host(place, field, reason):
    # An agent reads the portal leniently, but never a launch line's MASTER_ADDR or hostfile.
    node = {"hostname": "gpu-a01", "address": "10.0.0.1", "slots": 8, **place}
    booking = {
        "booking_id": 1,
        "owner": "alice",
        "device_uuids": [],
        "start": "2030-01-01T00:00:00Z",
        "end": "2030-01-01T01:00:00Z",
        "nodes": [node],
    }
    with pytest.raises(ProtocolError) as caught:
        from_json(DesiredBooking, booking)
    assert (caught.value.field, caught.value.reason) == (field, reason)
    fine = {**booking, "nodes": [{**node, "hostname": "gpu-a01.cluster", "address": "fd00::1"}]}
    assert from_json(DesiredBooking, fine).nodes[0].address == "fd00::1"
