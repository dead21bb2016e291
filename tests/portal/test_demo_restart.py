"""Day two of the demo: seed_demo, the agents' own registration and bookings, then seed_demo again
(as every start of `manage.py up` does) keeps the devices, their ids and the bookings."""

import json

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from agents import protocol
from agents.simulate import SimulatedBackend
from portal.models import Allocation, Booking, Gpu, MigInstance
from portal.services.fleet.nodes import node_token_issue
from portal.services.reporting.demo import DEMO_NODES, demo_site_id
from tests.factories import make_active_booking

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _var_dir(settings, tmp_path):
    """A fresh install: its own VAR_DIR, so its own site id."""
    settings.VAR_DIR = tmp_path / "var"


def _register_as_up_does(hostname: str, spec: str) -> None:
    """POST the register an agent started by `up` sends (its site id, its discovered inventory)."""
    backend = SimulatedBackend(spec, hostname, site=demo_site_id())
    message = protocol.RegisterRequest(hostname, "test", backend.discover())
    backend.close()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {node_token_issue(hostname=hostname)}")
    response = client.post(
        protocol.REGISTER_PATH,
        data=json.dumps(protocol.to_json(message)),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content[:500]


def _devices() -> list[tuple]:
    gpus = Gpu.objects.order_by("pk").values_list("pk", "uuid", "node__hostname", "index")
    migs = MigInstance.objects.order_by("pk").values_list("pk", "uuid", "gpu_id", "profile")
    return list(gpus) + list(migs)


def test_it_keeps_device_ids_and_bookings_when_the_demo_is_seeded_again():
    call_command("seed_demo", verbosity=0)
    for hostname, spec in DEMO_NODES.items():
        _register_as_up_does(hostname, spec)
    registered = _devices()
    whole = Gpu.objects.filter(node__hostname="gpu-a01").order_by("index")[:2]
    sliced = MigInstance.objects.filter(gpu__node__hostname="gpu-a03").order_by("pk")[:1]
    bookings = [make_active_booking(list(whole)), make_active_booking(list(sliced))]
    held = sorted(Allocation.objects.values_list("booking_id", "gpu_id", "mig_instance_id"))

    call_command("seed_demo", verbosity=0)  # the next start of up
    for hostname, spec in DEMO_NODES.items():
        _register_as_up_does(hostname, spec)

    assert _devices() == registered
    assert sorted(Allocation.objects.values_list("booking_id", "gpu_id", "mig_instance_id")) == held
    assert {b.state for b in Booking.objects.filter(pk__in=[b.pk for b in bookings])} == {"active"}


def test_it_seeds_the_devices_the_agents_of_this_install_report():
    call_command("seed_demo", verbosity=0)
    seeded = _devices()
    for hostname, spec in DEMO_NODES.items():
        _register_as_up_does(hostname, spec)
    assert _devices() == seeded  # the agents' first register renumbers nothing


def test_it_keeps_one_site_id_per_install(settings, tmp_path):
    first = demo_site_id()
    assert demo_site_id() == first and len(first) == 16
    settings.VAR_DIR = tmp_path / "another-install"
    assert demo_site_id() != first
