"""The demo: `up` points links at its own address and turns idle reclaim on; a simulated node
left idle gets its booking warned, then released."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.protocol import ReadingsRequest
from agents.simulate import SimulatedBackend
from portal.management.commands.up import notify_defaults
from portal.models import Booking, Delivery, IdleReclaim
from portal.services.fleet.nodes import node_inventory_from_spec
from portal.services.fleet.telemetry import samples_ingest
from portal.services.notify.reclaim import idle_reclaim_scan
from tests.factories import make_active_booking

pytestmark = pytest.mark.django_db


def test_it_points_links_at_the_address_up_serves_on(settings, monkeypatch):
    names = ("SITE_URL", "IDLE_RECLAIM_ENABLED", "IDLE_MINUTES", "IDLE_GRACE_MINUTES")
    for name in (*names, "QUOTA_BORROWING"):
        monkeypatch.setenv(name, "")  # set, so that the test's end takes it away again
    settings.IDLE_RECLAIM_ENABLED = settings.QUOTA_BORROWING = False
    notify_defaults("http://127.0.0.1:8765", demo=True)
    assert settings.SITE_URL == "http://127.0.0.1:8765"
    assert settings.IDLE_RECLAIM_ENABLED and settings.IDLE_MINUTES == 10
    assert settings.QUOTA_BORROWING  # carol's over-quota booking starts borrowed


def test_it_keeps_a_configured_site_url(settings, monkeypatch):
    monkeypatch.setenv("SITE_URL", "https://gpus.example.org")
    settings.SITE_URL = "https://gpus.example.org"
    notify_defaults("http://0.0.0.0:8000", demo=False)
    assert settings.SITE_URL == "https://gpus.example.org"


def test_it_warns_then_releases_a_booking_on_an_idle_simulated_node(
    owner, project, settings, django_capture_on_commit_callbacks
):
    settings.IDLE_RECLAIM_ENABLED = True
    settings.IDLE_MINUTES, settings.IDLE_GRACE_MINUTES = 10, 5
    node = node_inventory_from_spec(hostname="sim-idle", spec="1xA100-80GB")
    backend = SimulatedBackend("1xA100-80GB", hostname="sim-idle")
    booking = make_active_booking(list(node.gpus.all()), owner=owner, project=project)
    Booking.objects.filter(pk=booking.pk).update(started_at=timezone.now() - timedelta(hours=1))
    now = timezone.now()
    for minute in range(-11, 7):  # nobody runs anything: the simulated GPU idles
        request = ReadingsRequest("sim-idle", now + timedelta(minutes=minute), backend.sample())
        samples_ingest(node=node, request=request)
    with django_capture_on_commit_callbacks(execute=True):
        assert idle_reclaim_scan(now=now)["warned"] == 1
        assert idle_reclaim_scan(now=now + timedelta(minutes=6))["released"] == 1
    assert Booking.objects.get(pk=booking.pk).state == "finished"
    assert IdleReclaim.objects.get().state == "released"
    assert list(
        Delivery.objects.filter(channel="email").order_by("id").values_list("event", flat=True)
    ) == ["idle", "reclaimed"]
