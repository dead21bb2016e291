"""A batch job's environment through the API: working directory, variables, signal; validated at
submit with field-named 400s; a wide booking's desired state on each of its nodes."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from portal.models import Booking
from portal.services.fleet.runs import agent_desired_dispatch
from tests.conftest import error_of

pytestmark = pytest.mark.django_db

JOB = {"gpus": 1, "duration_s": 3600, "command": "python train.py"}


def test_it_stores_and_shows_a_jobs_environment(api, project, cluster, submit):
    booking_id = submit(
        **JOB, workdir="/scratch/alice/run1", env={"LR": "3e-4", "NOTE": ""}, signal="usr1@120"
    )
    body = api.get(f"/api/v1/bookings/{booking_id}/").json()
    assert body["workdir"] == "/scratch/alice/run1"
    assert body["env"] == {"LR": "3e-4", "NOTE": ""}
    assert body["signal"] == "USR1@120"
    assert body["output_file"] == f"gpu-portal-{booking_id}.out"
    assert body["restart_count"] == 0
    (listed,) = [b for b in api.get("/api/v1/bookings/").json()["results"] if b["id"] == booking_id]
    assert {k: listed[k] for k in ("workdir", "env", "signal", "output_file", "nodes")} == {
        k: body[k] for k in ("workdir", "env", "signal", "output_file", "nodes")
    }


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ({"workdir": "scratch/run"}, "workdir", "absolute path"),
        ({"workdir": "/x/" + "a" * 1030}, "workdir", "longer than 1024"),
        ({"workdir": "/tmp/a\nb"}, "workdir", "control characters"),
        ({"env": {"1BAD": "x"}}, "env.1BAD", "letters, digits and _"),
        ({"env": {"MASTER_PORT": "1"}}, "env.MASTER_PORT", "set by the portal"),
        ({"env": {"GPU_PORTAL_END": "1"}}, "env.GPU_PORTAL_END", "set by the portal"),
        ({"env": {"A": "x" * 4097}}, "env.A", "longer than 4096"),
        ({"env": {"A": "a\x00b"}}, "env.A", "Null characters"),
        ({"env": {f"V{i}": "1" for i in range(65)}}, "env", "at most 64"),
        ({"signal": "KILL@10"}, "signal", "not a signal a job can catch"),
        ({"signal": "USR1@soon"}, "signal", "whole number of seconds"),
        ({"signal": "USR1@0"}, "signal", "whole number of seconds"),
        ({"command": "", "interactive": "terminal", "workdir": "/tmp"}, "workdir", "command"),
    ],
)
def test_it_refuses_a_bad_job_environment_naming_the_field(
    api, project, cluster, extra, field, reason
):
    for path in ("/api/v1/bookings/", "/api/v1/bookings/estimate/"):
        response = api.post(path, {**JOB, **extra}, format="json")
        assert response.status_code == 400, (path, response.json())
        error = error_of(response)
        assert field in error["fields"], error
        assert reason in error["fields"][field], error
    assert not Booking.objects.exists()


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "APPTAINERENV_CUDA_VISIBLE_DEVICES",
        "APPTAINER_BIND",
        "SINGULARITYENV_NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
    ],
)
def test_it_refuses_variables_that_would_choose_the_jobs_devices(api, project, cluster, name):
    for path in ("/api/v1/bookings/", "/api/v1/bookings/estimate/"):
        response = api.post(path, {**JOB, "env": {name: "all"}}, format="json")
        assert response.status_code == 400, (path, response.json())
        assert error_of(response)["fields"] == {
            f"env.{name}": "is set by the portal for every job."
        }
    assert not Booking.objects.exists()


@pytest.mark.parametrize(
    ("job", "signal", "reason"),
    [
        ({"duration_s": 600}, "USR1@700", "700 s before the end is not within the booking's 600 s"),
        ({"duration_s": 600}, "USR1@600", "600 s before the end is not within the booking's 600 s"),
        ({"duration_s": 60}, "USR1", "60 s before the end is not within the booking's 60 s"),
        ({"duration_s": 600}, "USR1@١٢", "digits 0-9"),
        ({"duration_s": 600}, "USR1@+12", "digits 0-9"),
    ],
)
def test_it_refuses_a_signal_time_the_booking_does_not_last_or_of_other_digits(
    api, project, cluster, job, signal, reason
):
    body = {"gpus": 1, "command": "python train.py", **job, "signal": signal}
    for path in ("/api/v1/bookings/", "/api/v1/bookings/estimate/"):
        response = api.post(path, body, format="json")
        assert response.status_code == 400, (path, response.json())
        error = error_of(response)
        assert set(error["fields"]) == {"signal"} and reason in error["fields"]["signal"], error
    assert not Booking.objects.exists()


def test_it_measures_a_reservations_signal_time_against_its_window(api, project, cluster, submit):
    start = timezone.now() + timedelta(hours=1)
    window = {"start": start.isoformat(), "end": (start + timedelta(minutes=10)).isoformat()}
    body = {"gpus": 1, "command": "train", **window}
    response = api.post("/api/v1/bookings/", {**body, "signal": "USR1@600"}, format="json")
    assert response.status_code == 400, response.json()
    assert "within the booking's 600 s" in error_of(response)["fields"]["signal"]
    booking_id = submit(**body, signal="USR1@599")
    assert Booking.objects.get(pk=booking_id).signal_before_s == 599


def test_it_refuses_variables_that_are_not_strings(api, project, cluster):
    response = api.post("/api/v1/bookings/", {**JOB, "env": {"A": {"b": 1}}}, format="json")
    assert response.status_code == 400
    assert error_of(response)["fields"] == {"env.A": "Not a valid string."}


@pytest.mark.both_databases
@override_settings(JOB_SIGNAL_DEFAULT="USR2@300", JOB_KILL_WAIT_S=45)
def test_it_starts_a_sixteen_gpu_booking_as_one_process_per_node(api, project, cluster, submit):
    booking_id = submit(gpus=16, duration_s=3600, command="torchrun train.py")
    booking = Booking.objects.get(pk=booking_id)
    assert booking.state == "active"
    node_a, node_b = cluster
    rank0 = {b.booking_id: b for b in agent_desired_dispatch(node_id=node_a.pk).bookings}
    rank1 = {b.booking_id: b for b in agent_desired_dispatch(node_id=node_b.pk).bookings}
    first, second = rank0[booking_id], rank1[booking_id]
    assert [(n.hostname, n.address, n.slots) for n in first.nodes] == [
        ("node-a", "node-a", 8),
        ("node-b", "node-b", 8),
    ]
    assert first.nodes == second.nodes
    assert (first.node_rank, second.node_rank) == (0, 1)
    assert first.master_port == second.master_port == 29500
    assert (first.warn_signal, first.warn_before_s, first.kill_wait_s) == ("USR2", 300, 45)
    assert len(first.device_uuids) == len(second.device_uuids) == 8


@pytest.mark.both_databases
def test_it_books_whole_nodes_by_count(api, project, cluster, submit):
    booking_id = submit(node_count=2, duration_s=3600, command="torchrun train.py")
    booking = Booking.objects.get(pk=booking_id)
    assert booking.gpus == 16
    assert booking.allocations.values("gpu__node").distinct().count() == 2


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ({"node_count": 2, "gpus": 8}, "node_count", "takes whole nodes; 4 GPUs a node"),
        ({"node_count": 2, "gpus": 15}, "gpus", "multiple of node_count (2)"),
        ({"node_count": 0}, "node_count", "greater than or equal to 1"),
        ({"node_count": 1, "mig_profile": "3g.40gb"}, "node_count", "not a MIG slice"),
    ],
)
def test_it_refuses_a_node_count_that_cannot_be_whole_nodes(
    api, project, cluster, extra, field, reason
):
    body = {"duration_s": 3600, "command": "x", **extra}
    response = api.post("/api/v1/bookings/", body, format="json")
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert reason in error["fields"][field], error
    assert not Booking.objects.exists()
