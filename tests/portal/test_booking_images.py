"""A booking that names a container image: the site's allow-list, nodes' runtimes, the agent."""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.env import SettingError, envimagesources
from portal.models import Booking, Node
from portal.services.fleet.selectors import agent_desired
from tests.conftest import error_of
from tests.factories import make_node

pytestmark = pytest.mark.django_db
OCI = "docker://nvcr.io/nvidia/pytorch:24.05-py3"
SIF = "/shared/images/torch.sif"


@pytest.fixture
def sources(settings):
    settings.CONTAINER_IMAGE_SOURCES = ["docker://nvcr.io/nvidia/", "/shared/images/"]


def _post(api, **body):
    body = {k: v for k, v in {"gpus": 1, "duration_s": 600, **body}.items() if v is not None}
    return api.post("/api/v1/bookings/", body, format="json")


def _runtimes(node, *names):
    Node.objects.filter(pk=node.pk).update(container_runtimes=",".join(names))


def test_it_runs_an_allowed_image_on_a_node_with_a_runtime(
    api, project, cluster, sources, django_capture_on_commit_callbacks
):
    for node in cluster:
        _runtimes(node, "podman")
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(api, command="python train.py", image=OCI)
    assert response.status_code == 201, response.json()
    assert response.json()["image"] == OCI
    booking = Booking.objects.get(pk=response.json()["id"])
    assert booking.state == Booking.State.ACTIVE
    node = booking.allocations.get().gpu.node
    assert [b.image for b in agent_desired(node_id=node.pk).bookings] == [OCI]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"image": "docker://evil.example/miner:1"}, "not from an allowed source"),
        ({"image": OCI, "command": ""}, "give one"),
        ({"image": SIF}, "no node can run it: it needs apptainer or singularity"),
        ({"image": OCI, "gpu_model": "H100-80GB"}, "no node"),
    ],
)
def test_it_refuses_an_image_naming_the_field(api, project, cluster, sources, body, says):
    _runtimes(cluster[0], "podman")
    make_node("node-h", gpus=2, model="H100-80GB")  # no runtime at all
    before = Booking.objects.count()
    response = _post(api, **{"command": "run", **body})
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert set(error["fields"]) == {"image"} and says in error["fields"]["image"], error
    assert Booking.objects.count() == before


@pytest.mark.parametrize(
    ("image", "says"),
    [
        ("/shared/images/../../scratch/evil.sif", "not an image reference: an image file's path"),
        ("docker://nvcr.io/nvidia/../evil:1", "not an image reference: '..' is not a repository"),
        ("docker://nvcr.io/nvidia@evil", "not an image reference: digest 'evil'"),
        ("docker://nvcr.io/nvidia/pytorch latest", "not an image reference: an image reference"),
        ("docker://nvcr.io.evil.example/x", "not from an allowed source"),
        ("docker://registry.example.org/nvidia-evil/x", "not from an allowed source"),
        ("/shared/images-evil/x.sif", "not from an allowed source"),
    ],
)
@pytest.mark.parametrize("path", ["/api/v1/bookings/", "/api/v1/bookings/estimate/"])
def test_it_refuses_an_image_the_runtime_would_not_run_or_from_elsewhere(
    api, project, cluster, settings, image, says, path
):
    """Hosts are hosts and repositories and directories whole path segments, not text
    prefixes; what podman or apptainer would refuse is refused at submit and in the estimate."""
    settings.CONTAINER_IMAGE_SOURCES = [
        "docker://nvcr.io",
        "docker://registry.example.org/nvidia",
        "/shared/images/",
    ]
    for node in cluster:
        _runtimes(node, "podman", "apptainer")
    before = Booking.objects.count()
    body = {"gpus": 1, "duration_s": 600, "command": "run", "image": image}
    response = api.post(path, body, format="json")
    assert response.status_code == 400, response.json()
    error = error_of(response)
    assert set(error["fields"]) == {"image"} and says in error["fields"]["image"], error
    assert Booking.objects.count() == before


def test_it_refuses_to_start_with_an_image_source_that_is_none(monkeypatch):
    monkeypatch.setenv("CONTAINER_IMAGE_SOURCES", "docker://nvcr.io/nvidia,/shared/../scratch")
    with pytest.raises(SettingError, match="CONTAINER_IMAGE_SOURCES: '/shared/../scratch'"):
        envimagesources("CONTAINER_IMAGE_SOURCES")
    monkeypatch.setenv("CONTAINER_IMAGE_SOURCES", "docker://nvcr.io/nvidia, /shared/images/")
    assert envimagesources("CONTAINER_IMAGE_SOURCES") == [
        "docker://nvcr.io/nvidia",
        "/shared/images/",
    ]


def test_it_refuses_every_image_naming_the_setting_when_the_site_allows_none(
    api, project, cluster, settings
):
    settings.CONTAINER_IMAGE_SOURCES = []
    _runtimes(cluster[0], "podman")
    response = _post(api, command="run", image=OCI)
    assert response.status_code == 400
    assert error_of(response)["fields"]["image"] == (
        "this site runs no container images (CONTAINER_IMAGE_SOURCES is empty)."
    )


def test_it_refuses_an_image_in_an_estimate_as_at_submit(api, project, cluster, sources):
    body = {"gpus": 1, "duration_s": 600, "command": "x", "image": SIF}
    response = api.post("/api/v1/bookings/estimate/", body, format="json")
    assert response.status_code == 400
    assert "apptainer" in error_of(response)["fields"]["image"]


@pytest.mark.both_databases
def test_it_places_an_image_booking_on_a_node_that_can_run_it(
    api, project, cluster, sources, django_capture_on_commit_callbacks
):
    _runtimes(cluster[1], "podman")  # node-a has none
    with django_capture_on_commit_callbacks(execute=True):
        response = _post(api, gpus=2, command="python train.py", image=OCI)
        plain = _post(api, gpus=2, command="python train.py")
    on = Booking.objects.get(pk=response.json()["id"]).allocations.values_list(
        "gpu__node__hostname", flat=True
    )
    assert set(on) == {"node-b"}
    assert Booking.objects.get(pk=plain.json()["id"]).state == Booking.State.ACTIVE


def test_it_reserves_an_image_booking_on_a_node_that_can_run_it(api, project, cluster, sources):
    _runtimes(cluster[1], "podman")
    start = timezone.now() + timedelta(hours=1)
    window = {"start": start.isoformat(), "end": (start + timedelta(hours=1)).isoformat()}
    response = _post(api, command="python train.py", image=OCI, duration_s=None, **window)
    assert response.status_code == 201, response.json()
    on = Booking.objects.get(pk=response.json()["id"]).allocations.values_list(
        "gpu__node__hostname", flat=True
    )
    assert set(on) == {"node-b"}
