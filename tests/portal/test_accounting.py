"""Accounting (sreport-like): the API's JSON and CSV and the report page against numbers worked
out by hand from a small fixture."""

import csv
import io
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from portal.models import Allocation, Booking, Node, SampleMinute
from tests.factories import (
    BookingFactory,
    ProjectFactory,
    UserFactory,
    make_mig_gpu,
    make_node,
    member,
)

pytestmark = pytest.mark.django_db


def _held(booking, device, start, end, *, live=False):
    mig = device if hasattr(device, "profile") else None
    Allocation.objects.create(
        booking=booking,
        gpu=mig.gpu if mig else device,
        mig_instance=mig,
        start=start,
        end=end,
        fraction=mig.fraction if mig else 1.0,
        live=live,
    )


def _minutes(node, uuid, first, count, **values):
    SampleMinute.objects.bulk_create(
        SampleMinute(
            node=node, uuid=uuid, minute=first + timedelta(minutes=i), samples=12, **values
        )
        for i in range(count)
    )


@pytest.fixture
def ledger():
    """Period [T0, T0 + 3 h). Worked out by hand:

    vision: A (alice) gpu0 T0-1h..T0+1h -> 1 h in the period, 60 min x 300 W = 0.3 kWh, util 80;
            C (alice) 3g.40gb slice T0..T0+70min -> 70/60 x 3/7 = 0.5 GPU-h,
            70 min x 350 W (its GPU) x 3/7 = 0.175 kWh; peak memory 40000 MiB (gpu0).
            D (alice) reservation cancelled before it began: not charged.
    nlp:    B (bob) gpu1 T0+30min..T0+150min -> 2 GPU-h, 120 min x 200 W = 0.4 kWh, util 50.
    """
    t0 = (timezone.now() - timedelta(hours=3)).replace(second=0, microsecond=0)
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    vision, nlp = ProjectFactory(slug="vision"), ProjectFactory(slug="nlp")
    member(alice, vision)
    member(bob, nlp)
    node = make_node("acct-a", gpus=2)
    gpu0, gpu1 = node.gpus.order_by("index")
    slice3g = make_mig_gpu(node, 2).mig_instances.get(profile="3g.40gb")
    ended = {"state": Booking.State.FINISHED, "started_at": t0 - timedelta(hours=1)}
    a = BookingFactory(owner=alice, project=vision, **ended)
    b = BookingFactory(owner=bob, project=nlp, **ended)
    c = BookingFactory(owner=alice, project=vision, gpus=0, mig_profile="3g.40gb", **ended)
    d = BookingFactory(owner=alice, project=vision, state=Booking.State.CANCELLED)
    _held(a, gpu0, t0 - timedelta(hours=1), t0 + timedelta(hours=1))
    _held(b, gpu1, t0 + timedelta(minutes=30), t0 + timedelta(minutes=150))
    _held(c, slice3g, t0, t0 + timedelta(minutes=70))
    _held(d, gpu0, t0 + timedelta(hours=2), t0 + timedelta(minutes=150))
    _minutes(
        node,
        gpu0.uuid,
        t0 - timedelta(minutes=30),
        200,
        power_w_avg=300.0,
        utilization_gpu_avg=80.0,
        memory_used_mib_max=40000,
    )
    _minutes(node, gpu1.uuid, t0, 180, power_w_avg=200.0, utilization_gpu_avg=50.0)
    _minutes(node, slice3g.gpu.uuid, t0, 180, power_w_avg=350.0)
    _minutes(node, slice3g.uuid, t0, 70, memory_used_mib_max=5000)
    staff = UserFactory(username="root", is_staff=True)
    return t0, staff, alice


EXPECTED = [
    {
        "project": "nlp",
        "bookings": 1,
        "gpu_hours": 2.0,
        "borrowed_gpu_hours": 0.0,  # nothing ran borrowed
        "cpu_hours": 0.0,  # the node reports no cores and memory
        "memory_gb_hours": 0.0,
        "energy_kwh": 0.4,
        "mean_utilization": 50.0,
        "peak_memory_mib": None,
        "reserved_unused_gpu_hours": 0.0,  # no project reservation
    },
    {
        "project": "vision",
        "bookings": 2,
        "gpu_hours": 1.5,
        "borrowed_gpu_hours": 0.0,
        "cpu_hours": 0.0,
        "memory_gb_hours": 0.0,
        "energy_kwh": 0.475,
        "mean_utilization": 80.0,
        "peak_memory_mib": 40000,
        "reserved_unused_gpu_hours": 0.0,
    },
]


def _query(t0, **extra):
    return {
        "group_by": "project",
        "from": t0.isoformat(),
        "to": (t0 + timedelta(hours=3)).isoformat(),
        **extra,
    }


def test_it_reports_gpu_hours_energy_and_efficiency_per_project(ledger):
    t0, staff, _ = ledger
    client = Client()
    client.force_login(staff)
    response = client.get("/api/v1/accounting/", _query(t0))
    assert response.status_code == 200, response.content
    assert response.json() == EXPECTED


def test_it_exports_the_same_report_as_csv(ledger):
    t0, staff, _ = ledger
    client = Client()
    client.force_login(staff)
    response = client.get("/api/v1/accounting/", _query(t0, format="csv"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment;" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [(r["project"], float(r["gpu_hours"]), float(r["energy_kwh"])) for r in rows] == [
        (e["project"], e["gpu_hours"], e["energy_kwh"]) for e in EXPECTED
    ]


def test_it_exports_a_period_without_usage_as_a_header_row(ledger):
    t0, staff, _ = ledger
    client = Client()
    client.force_login(staff)
    quiet = {
        "from": (t0 - timedelta(days=30)).isoformat(),
        "to": (t0 - timedelta(days=29)).isoformat(),
    }
    response = client.get("/api/v1/accounting/", _query(t0, format="csv", group_by="user", **quiet))

    assert response.status_code == 200
    assert response.content.decode() == (
        "user,bookings,gpu_hours,borrowed_gpu_hours,cpu_hours,memory_gb_hours,energy_kwh,"
        "mean_utilization,peak_memory_mib\n"
    )


def test_it_reports_the_cores_and_memory_held_with_the_gpus_per_hour(ledger):
    """acct-a reports 48 cores and 384 GiB for its 3 GPUs. A asked 10 cores and 64 GiB
    (1 h in the period); B asked nothing: its GPU's share, 16 cores and 128 GiB, for 2 h;
    C's 3g.40gb slice (3/7 of a GPU) its share rounded down, for 70 minutes."""
    t0, staff, _ = ledger
    Node.objects.filter(hostname="acct-a").update(cpus=48, memory_mib=384 * 1024)
    a = Allocation.objects.get(gpu__index=0, booking__state=Booking.State.FINISHED).booking
    Booking.objects.filter(pk=a.pk).update(cpus=10, memory_mib=64 * 1024)
    client = Client()
    client.force_login(staff)
    rows = {r["project"]: r for r in client.get("/api/v1/accounting/", _query(t0)).json()}
    slice_cpus, slice_mib = int(48 * 3 / 7 / 3), int(384 * 1024 * 3 / 7 / 3)
    assert rows["nlp"]["cpu_hours"] == 16 * 2.0
    assert rows["nlp"]["memory_gb_hours"] == 128 * 2.0
    assert rows["vision"]["cpu_hours"] == pytest.approx(10 + slice_cpus * 70 / 60, abs=1e-3)
    assert rows["vision"]["memory_gb_hours"] == pytest.approx(
        64 + slice_mib / 1024 * 70 / 60, abs=1e-3
    )
    page = client.get("/accounting/", {"from": t0.date().isoformat()}).content.decode()
    assert "Core-hours" in page


def test_it_groups_by_user_and_by_booking(ledger):
    t0, staff, _ = ledger
    client = Client()
    client.force_login(staff)
    by_user = client.get("/api/v1/accounting/", _query(t0, group_by="user")).json()
    assert [(r["user"], r["gpu_hours"]) for r in by_user] == [("bob", 2.0), ("alice", 1.5)]
    by_booking = client.get("/api/v1/accounting/", _query(t0, group_by="booking")).json()
    assert sorted(r["gpu_hours"] for r in by_booking) == [0.5, 1.0, 2.0]  # D not charged


def test_it_shows_a_member_only_their_projects(ledger):
    t0, _, alice = ledger
    client = Client()
    client.force_login(alice)
    rows = client.get("/api/v1/accounting/", _query(t0)).json()
    assert [r["project"] for r in rows] == ["vision"]


def test_the_report_page_agrees_with_the_fixture(ledger):
    t0, staff, _ = ledger
    client = Client()
    client.force_login(staff)
    page = client.get("/accounting/", _query(t0)).content.decode()
    assert "<td>nlp</td>" in page and "<td>vision</td>" in page
    for number in ("2.00", "1.50", "0.400", "0.475", "3.50", "0.875", "80.0 %", "40000 MiB"):
        assert f'class="num">{number}' in page, number
    assert "format=csv" in page  # the download link carries the same period


@pytest.mark.parametrize(
    "params, field",
    [
        ({"group_by": "team", "from": "2026-11-01T00:00:00Z"}, "group_by"),
        ({"group_by": "project"}, "from"),
        (
            {"group_by": "project", "from": "2026-12-01T00:00:00Z", "to": "2026-11-01T00:00:00Z"},
            "from",
        ),
        (
            {"group_by": "project", "from": "2024-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"},
            "to",
        ),
    ],
)
def test_it_refuses_a_bad_period_or_grouping_naming_the_field(api, params, field):
    response = api.get("/api/v1/accounting/", params)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_it_neutralises_a_node_model_that_is_a_formula_in_the_csv(ledger):
    t0, staff, _ = ledger
    Gpu = Allocation._meta.get_field("gpu").related_model
    Gpu.objects.filter(node__hostname="acct-a").update(
        model='=HYPERLINK("http://evil.example","x")'
    )
    client = Client()
    client.force_login(staff)
    response = client.get("/api/v1/accounting/", _query(t0, format="csv", group_by="model"))
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows and {r["model"] for r in rows} == {'\'=HYPERLINK("http://evil.example","x")'}
