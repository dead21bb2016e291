"""Every page at desktop and phone width, light and dark: no script errors, no sideways page.

Screenshots land in test-artifacts/ (gitignored) for people to look at.
"""

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Allocation, Booking, Gpu, ProcessUsage, Sample
from portal.services.access.audit import Source, audit_record
from portal.services.access.tokens import token_create
from portal.services.inventory.telemetry_cache import latest_store
from portal.services.notify.booking_links import action_token
from tests.factories import (
    AllocationFactory,
    BookingFactory,
    ProjectFactory,
    QuotaFactory,
    UserFactory,
    make_mig_gpu,
    make_node,
    member,
)
from tests.web.conftest import ARTIFACTS, sign_in

pytestmark = pytest.mark.browser
PAGES = [
    ("overview", "/"),
    ("bookings", "/bookings/"),
    ("book", "/book/"),
    ("calendar", "/calendar/"),
    ("calendar-day", "/calendar/?view=day"),
    ("queue", "/queue/"),
    ("gpu", "/gpus/{gpu}/"),
    ("booking", "/bookings/{booking}/"),
    ("project", "/projects/vision/"),
    ("accounting", "/accounting/?period=7d"),
    ("tokens", "/tokens/"),
    ("booking-batch-running", "/bookings/{batch_active}/"),
    ("booking-batch-done", "/bookings/{batch_done}/"),
    ("notification-settings", "/settings/notifications/"),
    ("action-confirm", "/actions/{action}/"),
]
# A batch job's output as a training script prints it: progress lines, and one long line.
LOG_TAIL = "\n".join(
    [
        f"epoch {e:>3}/90  step {s:>5}  loss {2.31 - e * 0.02:.4f}  lr 3.0e-04  12.8 it/s"
        for e in range(1, 4)
        for s in (100, 200, 300)
    ]
    + ["warning: " + "torch.distributed.elastic.multiprocessing.redirects: NOTE: " * 4]
)
VIEWS = [("desktop", 1280, 900), ("phone", 390, 844)]


@pytest.fixture
def site(transactional_db):
    """A small site: two nodes (one with MIG slices), bookings in every live state, readings."""
    now = timezone.now()
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    project = ProjectFactory(slug="vision", name="Vision lab")
    member(alice, project)
    member(bob, project)
    QuotaFactory(project=project, max_gpus=8, gpu_hours_budget=500)
    node = make_node("gpu-a01", gpus=4, model="H100-80GB")
    make_mig_gpu(make_node("gpu-a02", gpus=2), 2)
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    mine = BookingFactory(owner=alice, project=project, gpus=2, state=Booking.State.ACTIVE)
    mine.started_at = now - timedelta(hours=1)
    mine.save()
    for gpu in gpus[:2]:
        AllocationFactory(
            booking=mine, gpu=gpu, start=now - timedelta(hours=1), end=now + timedelta(hours=3)
        )
    theirs = BookingFactory(owner=bob, project=project, state=Booking.State.PLANNED)
    AllocationFactory(
        booking=theirs, gpu=gpus[2], start=now + timedelta(days=1), end=now + timedelta(days=2)
    )
    BookingFactory(
        owner=alice,
        project=project,
        gpus=4,
        gpu_model="H100-80GB",
        planned_start=now + timedelta(hours=3),
        queue_position=1,
        pending_reason="resources",
        state_detail="Waiting for 4 free H100-80GB GPUs; two free at the planned start.",
        priority={"age": 12, "qos": 100, "size": 4, "total": 1316, "fairshare": 1200},
    )
    readings = {}
    for index, gpu in enumerate(Gpu.objects.all()):
        readings[gpu.uuid] = _reading(gpu.memory_mib, 15.0 * index)
    for allocation in Allocation.objects.filter(booking=mine):
        readings[allocation.gpu.uuid]["processes"] = [
            {"pid": 1, "user": "alice", "used_memory_mib": 1, "name": "python"}
        ]
    for gpu in Gpu.objects.filter(mig_mode=True):
        for mig in gpu.mig_instances.all():
            readings[mig.uuid] = _reading(mig.memory_mib, None)
    # Who is on my GPU: alice's job on her booked GPU, and a process nobody booked on gpu3.
    readings[gpus[3].uuid]["processes"] = [
        {"pid": 31337, "user": "eve", "used_memory_mib": 2048, "name": "miner"}
    ]
    for gpu, booking, pid, user, name, foreign in (
        (gpus[0], mine, 1, "alice", "python", False),
        (gpus[3], None, 31337, "eve", "miner", True),
    ):
        ProcessUsage.objects.create(
            node=node,
            device_uuid=gpu.uuid,
            booking=booking,
            booking_key=booking.pk if booking else 0,
            pid=pid,
            user=user,
            name=name,
            first_seen=now - timedelta(minutes=50),
            last_seen=now,
            peak_memory_mib=2048,
            samples=600,
            foreign=foreign,
        )
    # Batch jobs: one running on gpu2 with output so far, one finished earlier today on gpu0.
    running = BookingFactory(
        owner=alice,
        project=project,
        state=Booking.State.ACTIVE,
        submitted_at=now - timedelta(minutes=31),
        started_at=now - timedelta(minutes=30),
        duration_s=9000,
        command="python train.py --epochs 90 --data /scratch/imagenet",
        log_tail=LOG_TAIL,
    )
    AllocationFactory(
        booking=running,
        gpu=gpus[2],
        start=now - timedelta(minutes=30),
        end=now + timedelta(hours=2),
    )
    done = BookingFactory(
        owner=alice,
        project=project,
        state=Booking.State.FINISHED,
        submitted_at=now - timedelta(hours=6, minutes=1),
        started_at=now - timedelta(hours=6),
        duration_s=7200,
        ended_at=now - timedelta(hours=4),
        command="python eval.py --checkpoint runs/42/best.pt",
        exit_code=0,
        log_tail=LOG_TAIL + "\ntop-1 76.4%  top-5 93.1%\ndone in 1:58:12",
    )
    AllocationFactory(
        booking=done,
        gpu=gpus[0],
        start=now - timedelta(hours=6),
        end=now - timedelta(hours=4),
        live=False,
    )
    latest_store(readings)
    token_create(user=alice, now=now, name="laptop", expires_at=now + timedelta(days=30))
    token_create(user=alice, now=now, name="grafana dashboard", scope="read")
    UserFactory(username="root", is_staff=True, is_superuser=True)
    audit_record(action="login", actor=bob, source=Source(via="web", address="192.0.2.10"))
    audit_record(
        action="quota.change",
        actor=alice,
        source=Source(via="admin", address="2001:db8::1"),
        project=project,
        before={"max_gpus": 4.0, "gpu_hours_budget": 200.0},
        after={"max_gpus": 8.0, "gpu_hours_budget": 500.0},
    )
    # An hour of history on gpu0, every 30 s, with the node silent for ten minutes in between.
    Sample.objects.bulk_create(
        Sample(
            node=node,
            uuid=gpus[0].uuid,
            time=now - timedelta(seconds=30 * i),
            utilization_gpu=60.0 + (i % 7) * 4,
            memory_used_mib=30_000 + i * 10,
            temperature_c=55.0 + (i % 5),
            power_w=300.0 + (i % 9) * 5,
        )
        for i in range(120)
        if not 40 <= i < 60
    )
    return {
        "gpu": gpus[0].pk,
        "booking": mine.pk,
        "batch_active": running.pk,
        "batch_done": done.pk,
        # The link a "your booking ends soon" message carries: it opens the confirm page.
        "action": action_token(booking=mine, action="extend"),
    }


def _reading(total_mib: int, utilization):
    return {
        "utilization_gpu": utilization,
        "utilization_memory": None,
        "memory_used_mib": total_mib // 3,
        "memory_total_mib": total_mib,
        "temperature_c": 48.0 if utilization is not None else None,
        "power_w": 210.0 if utilization is not None else None,
        "processes": [],
        "time": timezone.now().isoformat(),
    }


def _render_all(chromium, base_url: str, *, user: str, pages, scheme: str, values=None):
    """Open each page at desktop and phone width in one colour scheme: a screenshot each, no
    script error, no sideways scrolling. Yields each signed-in page after its tour."""
    ARTIFACTS.mkdir(exist_ok=True)
    for view, width, height in VIEWS:
        context = chromium.new_context(
            viewport={"width": width, "height": height}, color_scheme=scheme
        )
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))
        sign_in(page, base_url, user, "pw-secret-123")
        for name, path in pages:
            response = page.goto(base_url + path.format(**(values or {})))
            assert response.status == 200, path
            page.wait_for_load_state("networkidle")
            page.screenshot(path=str(ARTIFACTS / f"{name}-{view}-{scheme}.png"), full_page=True)
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 1, f"{path} scrolls sideways by {overflow}px at {view} width"
        yield page
        context.close()
        assert errors == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_it_renders_every_page_on_desktop_and_phone(site, asgi_server, chromium, scheme):
    for _page in _render_all(
        chromium, asgi_server, user="alice", pages=PAGES, scheme=scheme, values=site
    ):
        pass


STAFF_PAGES = [("audit", "/audit/"), ("staff", "/staff/")]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_it_renders_the_staff_pages(site, asgi_server, chromium, scheme):
    for page in _render_all(chromium, asgi_server, user="root", pages=STAFF_PAGES, scheme=scheme):
        assert page.goto(asgi_server + "/audit/").ok
        assert page.locator("td", has_text="quota.change").count() == 1
        assert page.goto(asgi_server + "/staff/").ok
        assert page.locator("table.nodes th[scope=row]").count() == 2
