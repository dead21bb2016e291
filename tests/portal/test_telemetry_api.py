"""Telemetry in the REST API: latest readings on gpus/ and mig-instances/, history per device
and per booking."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import SampleMinute
from portal.services.inventory import telemetry_cache
from tests.conftest import error_of
from tests.factories import SampleFactory, make_active_booking, make_mig_gpu, make_node

pytestmark = pytest.mark.django_db


def _latest(uuid, **values):
    reading = {
        "uuid": uuid,
        "utilization_gpu": None,
        "utilization_memory": None,
        "memory_used_mib": 0,
        "memory_total_mib": 81920,
        "temperature_c": None,
        "power_w": None,
        "processes": [],
        "node": "node-t",
        "time": timezone.now().isoformat(),
    }
    telemetry_cache.latest_store({uuid: {**reading, **values}})


def test_it_lists_gpus_and_instances_with_their_latest_reading_in_one_lookup(
    api, django_assert_max_num_queries
):
    node = make_node("node-t", gpus=2)
    mig = make_mig_gpu(node, 2)
    gpu0 = node.gpus.get(index=0)
    slice1g = mig.mig_instances.filter(profile="1g.10gb").first()
    _latest(gpu0.uuid, utilization_gpu=88.0, power_w=301.5, energy_mj=42, processes=[{"pid": 1}])
    _latest(slice1g.uuid, memory_used_mib=700, memory_total_mib=10240)

    with django_assert_max_num_queries(4):  # count, page, MIG instances (+ session)
        gpus = api.get("/api/v1/gpus/").json()["results"]
    by_index = {g["index"]: g for g in gpus}
    assert by_index[0]["reading"]["utilization_gpu"] == 88.0
    assert by_index[0]["reading"]["energy_mj"] == 42 and by_index[0]["reading"]["processes"] == 1
    assert by_index[1]["reading"] is None  # nothing reported lately: null, not zeros
    assert api.get(f"/api/v1/gpus/{gpu0.pk}/").json()["reading"]["power_w"] == 301.5

    instances = api.get("/api/v1/mig-instances/").json()["results"]
    reading = next(i for i in instances if i["uuid"] == slice1g.uuid)["reading"]
    assert reading["memory_used_mib"] == 700 and reading["utilization_gpu"] is None
    one = api.get(f"/api/v1/mig-instances/{slice1g.pk}/").json()
    assert one["reading"]["memory_total_mib"] == 10240


def test_it_answers_a_devices_history_raw_or_as_minute_averages(api):
    node = make_node("node-t", gpus=1)
    gpu = node.gpus.get()
    now = timezone.now().replace(microsecond=0)
    for minutes, util in ((30, 10.0), (20, 20.0), (10, 30.0)):
        SampleFactory(
            node=node, uuid=gpu.uuid, time=now - timedelta(minutes=minutes), utilization_gpu=util
        )
    minute = (now - timedelta(days=3)).replace(second=0)
    SampleMinute.objects.create(
        node=node,
        uuid=gpu.uuid,
        minute=minute,
        samples=12,
        utilization_gpu_avg=55.0,
        utilization_gpu_max=70.0,
        memory_total_mib=81920,
    )

    raw = api.get(f"/api/v1/gpus/{gpu.pk}/history/").json()  # default: the last hour
    assert raw["resolution"] == "raw" and raw["device"] == "node-t/gpu0"
    assert [p["utilization_gpu"] for p in raw["points"]] == [10.0, 20.0, 30.0]

    since = (now - timedelta(days=4)).isoformat()
    until = (now - timedelta(days=2)).isoformat()
    old = api.get(f"/api/v1/gpus/{gpu.pk}/history/", {"from": since, "to": until}).json()
    assert old["resolution"] == "minute"
    assert [p["utilization_gpu"] for p in old["points"]] == [55.0]

    two = api.get(f"/api/v1/gpus/{gpu.pk}/history/", {"max_points": 2}).json()["points"]
    assert len(two) == 2 and two[0]["utilization_gpu"] == 15.0  # runs averaged


@pytest.mark.parametrize(
    "params, field",
    [
        ({"from": "yesterday"}, "from"),
        ({"resolution": "hourly"}, "resolution"),
        ({"max_points": 0}, "max_points"),
        ({"color": "red"}, "color"),
    ],
)
def test_it_refuses_a_bad_history_query_naming_the_field(api, params, field):
    gpu = make_node("node-t", gpus=1).gpus.get()
    response = api.get(f"/api/v1/gpus/{gpu.pk}/history/", params)
    assert response.status_code == 400
    assert field in error_of(response)["fields"]


def test_it_refuses_raw_history_older_than_raw_retention_and_a_backwards_range(api):
    gpu = make_node("node-t", gpus=1).gpus.get()
    now = timezone.now()
    old = {"from": (now - timedelta(days=3)).isoformat(), "resolution": "raw"}
    response = api.get(f"/api/v1/gpus/{gpu.pk}/history/", old)
    assert response.status_code == 400
    assert "raw samples are kept for 24 h" in error_of(response)["fields"]["from"]
    backwards = {"from": now.isoformat(), "to": (now - timedelta(hours=1)).isoformat()}
    response = api.get(f"/api/v1/gpus/{gpu.pk}/history/", backwards)
    assert response.status_code == 400 and "from" in error_of(response)["fields"]


def test_it_answers_a_bookings_history_over_the_time_it_held_its_devices(api, user, project):
    node = make_node("node-t", gpus=2)
    gpu0, gpu1 = node.gpus.order_by("index")
    booking = make_active_booking([gpu1], owner=user, project=project)
    now = timezone.now()
    SampleFactory(node=node, uuid=gpu1.uuid, time=now - timedelta(seconds=30), power_w=250.0)
    SampleFactory(node=node, uuid=gpu1.uuid, time=now - timedelta(minutes=5), power_w=999.0)
    SampleFactory(node=node, uuid=gpu0.uuid, time=now - timedelta(seconds=30), power_w=111.0)

    body = api.get(f"/api/v1/bookings/{booking.pk}/history/").json()
    assert body["booking"] == booking.pk and body["resolution"] == "raw"
    [device] = body["devices"]
    assert device["uuid"] == gpu1.uuid and device["device"] == "node-t/gpu1"
    # Only since the booking started a minute ago: the 5-minute-old sample is someone else's.
    assert [p["power_w"] for p in device["points"]] == [250.0]


def test_it_hides_another_users_booking_history(api, project):
    gpu = make_node("node-t", gpus=1).gpus.get()
    theirs = make_active_booking([gpu], project=project)
    response = api.get(f"/api/v1/bookings/{theirs.pk}/history/")
    assert response.status_code == 404
