"""End to end in headless Chromium against a daphne server: book, watch it live, cancel."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from portal.models import Booking
from portal.services.booking.bookings import booking_extend
from tests.factories import ProjectFactory, QuotaFactory, UserFactory, make_node, member
from tests.web.conftest import ARTIFACTS, in_thread, sign_in, wait_for

pytestmark = pytest.mark.browser
PASSWORD = "pw-secret-123"


@pytest.fixture
def alice(transactional_db):
    user = UserFactory(username="alice")
    project = ProjectFactory(slug="vision", name="Vision lab")
    member(user, project)
    QuotaFactory(project=project, max_gpus=16)
    make_node("node-a")
    return user


def _telemetry(uuid: str, utilization: float) -> None:
    reading = {
        "uuid": uuid,
        "utilization_gpu": utilization,
        "utilization_memory": 20.0,
        "memory_used_mib": 30 * 1024,
        "memory_total_mib": 80 * 1024,
        "temperature_c": 61.0,
        "power_w": 312.0,
        "processes": [],
        "time": timezone.now().isoformat(),
    }
    message = {
        "type": "telemetry.readings",
        "node": "node-a",
        "time": reading["time"],
        "readings": [reading],
    }
    async_to_sync(get_channel_layer().group_send)("telemetry", message)


def _local(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def test_it_books_watches_live_and_cancels(alice, asgi_server, browser_page):
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)

    page.goto(f"{asgi_server}/book/")
    # Before submitting, the form shows what the allocator would give (ASAP by default).
    wait_for(page, 'document.getElementById("estimate").textContent.includes("Earliest start")')
    page.check("#id_when_1")
    now = timezone.now()
    page.fill("#id_start", _local(now))
    page.fill("#id_end", _local(now + timedelta(hours=2)))
    page.fill("#id_gpus", "1")
    wait_for(
        page,
        'document.getElementById("estimate").textContent.includes("free for the whole window")',
    )
    # The start is to the minute and may be up to a minute behind now; the estimate above can
    # take a while on a loaded machine, so the start is set again just before submitting.
    page.fill("#id_start", _local(timezone.now()))
    page.click("button:has-text('Submit booking')")

    # The click returns before the server has answered: the booking exists once the page is its.
    page.wait_for_url(re.compile(r"/bookings/\d+/$"), timeout=30_000)
    booking = Booking.objects.get()
    assert page.url == f"{asgi_server}/bookings/{booking.pk}/"
    assert page.text_content("#booking-state").strip() == "Active"
    page.wait_for_selector("body[data-live-state='open']")
    page.evaluate("window.__sameDocument = true")

    uuid = booking.allocations.get().device_uuid
    cell = f"[data-uuid='{uuid}'] [data-metric='utilization_gpu']"
    assert page.text_content(cell).strip() == "no reading yet"
    in_thread(_telemetry, uuid, 87.0)
    wait_for(page, f'document.querySelector("{cell}")?.textContent.trim() === "87 %"')

    # A change made elsewhere reaches the page as a booking message and a fragment re-fetch.
    length = page.text_content("#booking-length")
    in_thread(booking_extend, user=alice, booking_id=booking.pk, now=timezone.now(), by_s=3600)
    wait_for(page, f"document.getElementById('booking-length').textContent !== {length!r}")
    assert page.text_content("#booking-length").startswith("2 h 5")
    assert page.evaluate("window.__sameDocument") is True

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button.danger:has-text('Cancel')")
    wait_for(
        page, "(document.getElementById('booking-state') || {}).textContent?.trim() === 'Cancelled'"
    )
    booking.refresh_from_db()
    assert booking.state == Booking.State.CANCELLED


def test_it_shows_a_bad_field_at_the_field(alice, asgi_server, browser_page):
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/book/")
    page.fill("#id_gpus", "0")
    page.click("button:has-text('Submit booking')")
    error = page.wait_for_selector("#id_gpus_error")
    assert "at least 1" in error.text_content()
    assert page.get_attribute("#id_gpus", "aria-invalid") == "true"
    assert "id_gpus_error" in page.get_attribute("#id_gpus", "aria-describedby")
    assert Booking.objects.count() == 0


def test_it_catches_up_after_the_line_drops(alice, asgi_server, browser_page):
    page = browser_page
    project = alice.projects.get()
    booking = Booking.objects.create(
        owner=alice, project=project, gpus=2, duration_s=3600, submitted_at=timezone.now()
    )
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.wait_for_selector("body[data-live-state='open']")
    assert "start time not known yet" in page.text_content("[data-fragment='mine']")

    # Changed without any broadcast: only a re-fetch after reconnecting can show it.
    Booking.objects.filter(pk=booking.pk).update(
        planned_start=timezone.now() + timedelta(hours=2), queue_position=3
    )
    page.evaluate("window.portalLive.drop()")
    wait_for(
        page, "document.querySelector('[data-fragment=mine]')?.textContent.includes('position 3')"
    )
    assert page.get_attribute("body", "data-live-state") == "open"


def test_it_asks_for_the_estimate_again_when_the_portal_answers_busy(
    alice, asgi_server, browser_page
):
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    refused = []

    def busy_once(route):
        # The server's own answer when it sheds load: 503 with Retry-After.
        if not refused:
            refused.append(route.request.url)
            route.fulfill(status=503, headers={"Retry-After": "1"}, json={"error": {}})
        else:
            route.continue_()

    page.route("**/estimate/", busy_once)
    page.goto(f"{asgi_server}/book/")
    wait_for(page, 'document.getElementById("estimate").dataset.state === "busy"')
    assert "estimating again in 1 s" in page.inner_text("#estimate")
    wait_for(page, 'document.getElementById("estimate").textContent.includes("Earliest start: ")')
    assert page.get_attribute("#estimate", "data-state") == "ok" and len(refused) == 1


def test_it_offers_a_zoomed_chart_range_as_a_page_of_its_own(alice, asgi_server, browser_page):
    from portal.models import Gpu, Sample

    gpu = Gpu.objects.get(node__hostname="node-a", index=0)
    now = timezone.now()
    Sample.objects.bulk_create(
        Sample(node=gpu.node, uuid=gpu.uuid, time=now - timedelta(minutes=m), power_w=100.0 + m)
        for m in range(50)
    )
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/gpus/{gpu.pk}/")
    wait_for(page, 'document.querySelectorAll(".plot .main-svg").length > 0')
    assert page.is_hidden("[data-zoom-link]")
    # What a drag across the chart does: plotly relayouts the x axis to the dragged range.
    page.evaluate(
        """() => Plotly.relayout(document.querySelector('.plot'), {
            'xaxis.range[0]': '2026-12-01 09:10:00', 'xaxis.range[1]': '2026-12-01 09:20:30'})"""
    )
    wait_for(page, '!document.querySelector("[data-zoom-link]").hidden')
    href = page.get_attribute("[data-zoom-link]", "href")
    assert "range=custom" in href and "from=2026-12-01T09%3A10%3A00" in href
    assert "to=2026-12-01T09%3A20%3A30" in href


def test_it_says_signed_out_and_stops_reconnecting(alice, asgi_server, browser_page):
    page = browser_page
    sockets = []
    page.on("websocket", lambda socket: sockets.append(socket.url))
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.wait_for_selector("body[data-live-state='open']")
    assert len(sockets) == 1

    # The session goes away (signed out elsewhere, expired); the next connect is anonymous.
    page.context.clear_cookies()
    page.evaluate("window.portalLive.drop()")
    wait_for(page, "document.body.dataset.liveState === 'signed-out'")
    status = page.locator("#live-status")
    assert status.text_content() == "Signed out — sign in again"
    assert status.locator("a").get_attribute("href") == "/accounts/login/?next=%2F"
    page.wait_for_timeout(3000)  # backoff would have tried again by now (0.5-1 s, then 1-2 s)
    assert len(sockets) == 2
    page.screenshot(path=str(ARTIFACTS / "signed-out.png"))


def _output(node, booking, tail: str) -> None:
    from agents.protocol import Event, EventsRequest
    from portal.services.fleet.agents import agent_events_record

    event = Event("output", timezone.now(), booking_id=booking.pk, log_tail=tail)
    agent_events_record(node=node, request=EventsRequest([event]))


def test_it_shows_a_batch_bookings_output_live(alice, asgi_server, browser_page, settings):
    from portal.models import Gpu
    from tests.factories import make_active_booking

    settings.BOOKING_OUTPUT_MIN_INTERVAL_S = 0
    page = browser_page
    gpu = Gpu.objects.filter(node__hostname="node-a").order_by("index").first()
    booking = make_active_booking(
        [gpu], owner=alice, project=alice.projects.get(), command="python train.py --epochs 200"
    )
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/bookings/{booking.pk}/")
    page.wait_for_selector("body[data-live-state='open']")
    assert "No output yet" in page.text_content("#output-empty")
    assert page.get_attribute("#booking-output", "aria-labelledby") == "output-h"

    in_thread(_output, gpu.node, booking, "loading data\n")
    wait_for(page, "document.getElementById('booking-output').textContent === 'loading data\\n'")
    assert page.is_hidden("#output-empty")

    lines = "".join(f"epoch {i}: loss {1 / i:.4f}\n" for i in range(1, 121))
    in_thread(_output, gpu.node, booking, lines)
    wait_for(page, "document.getElementById('booking-output').textContent.includes('epoch 120')")
    # It follows the newest line: scrolled to the bottom of a box shorter than the output.
    scroll = page.evaluate(
        "(() => { const p = document.getElementById('booking-output');"
        " return [p.scrollTop, p.scrollHeight - p.clientHeight]; })()"
    )
    assert scroll[0] > 0 and abs(scroll[0] - scroll[1]) < 2
    page.screenshot(path=str(ARTIFACTS / "booking-output.png"), full_page=True)


def _unbooked_process(node, uuid: str) -> None:
    from agents.protocol import DeviceReading, ProcessReading, ReadingsRequest
    from portal.services.fleet.telemetry import samples_ingest

    reading = DeviceReading(
        uuid, 3.0, 1.0, 900, 81920, 40.0, 90.0, [ProcessReading(666, "eve", 512, "miner")]
    )
    samples_ingest(
        node=node,
        request=ReadingsRequest(hostname=node.hostname, time=timezone.now(), readings=[reading]),
    )


def test_it_turns_a_free_device_to_in_use_unbooked_live(alice, asgi_server, browser_page):
    from portal.models import Gpu

    page = browser_page
    gpu = Gpu.objects.filter(node__hostname="node-a").order_by("index").first()
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.wait_for_selector("body[data-live-state='open']")
    badge = f"tr[data-uuid='{gpu.uuid}'] .badge"
    assert page.text_content(badge).strip() == "free"
    page.evaluate("window.__sameDocument = true")

    in_thread(_unbooked_process, gpu.node, gpu.uuid)
    wait_for(page, f"document.querySelector(\"{badge}\").textContent.trim() === 'in use, unbooked'")
    assert "7" in page.text_content("[data-fragment='totals'] dd")  # 7 of 8 free now
    assert page.evaluate("window.__sameDocument") is True


def test_it_shows_an_estimates_date_with_its_year_this_year_or_next(
    alice, asgi_server, browser_page
):
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    year = timezone.now().year
    answers = iter([f"{year + 1}-01-05T10:00:00Z", f"{year}-12-31T10:00:00Z"])

    def estimate(route):
        route.fulfill(
            json={"planned_start": next(answers), "pending_reason": "fits", "state_detail": ""}
        )

    page.route("**/estimate/", estimate)
    page.goto(f"{asgi_server}/book/")
    wait_for(page, 'document.getElementById("estimate").dataset.state === "ok"')
    assert f"{year + 1}-01-05 10:00 UTC" in page.inner_text("#estimate")
    page.fill("#id_gpus", "2")
    wait_for(page, 'document.getElementById("estimate").textContent.includes("-12-31 10:00")')
    assert f"{year}-12-31 10:00 UTC" in page.inner_text("#estimate")  # this year's, in full too


def test_it_offers_the_next_window_that_fits_and_fills_it_in(alice, asgi_server, browser_page):
    from portal.models import Gpu, Project
    from tests.factories import make_active_booking

    gpus = list(Gpu.objects.order_by("index"))
    vision = Project.objects.get(slug="vision")
    held = make_active_booking(gpus, owner=alice, project=vision, gpus=len(gpus))
    held_until = held.allocations.order_by("end").last().end
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/book/")
    page.check("#id_when_1")
    start = timezone.now() + timedelta(minutes=10)
    page.fill("#id_start", _local(start))
    page.fill("#id_end", _local(start + timedelta(minutes=30)))
    page.fill("#id_gpus", "1")
    wait_for(page, 'document.getElementById("estimate").dataset.state === "next"')
    assert "Next free window of the same length" in page.inner_text("#estimate")
    page.click("#use-next-window")
    # The next whole minute once every GPU is free again, for the same 30 minutes.
    first = (held_until + timedelta(seconds=59)).replace(second=0, microsecond=0)
    assert page.input_value("#id_start") == first.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    end = first + timedelta(minutes=30)
    assert page.input_value("#id_end") == end.astimezone(UTC).strftime("%Y-%m-%d %H:%M")
    wait_for(
        page,
        'document.getElementById("estimate").textContent.includes("free for the whole window")',
    )


def test_it_books_a_fraction_of_a_shared_gpu_with_its_estimate(alice, asgi_server, browser_page):
    from portal.models import Gpu

    Gpu.objects.filter(node__hostname="node-a", index=7).update(sharing=Gpu.Sharing.SHARED)
    page = browser_page
    sign_in(page, asgi_server, "alice", PASSWORD)
    page.goto(f"{asgi_server}/book/")
    page.check("input[name=kind][value=shared]")
    assert page.is_visible("#id_gpu_fraction") and not page.is_visible("#id_gpus")
    page.fill("#id_gpu_fraction", "0.25")
    page.fill("#id_gpu_memory_gib", "20")
    wait_for(page, 'document.getElementById("estimate").textContent.includes("Earliest start")')
    page.click("button:has-text('Submit booking')")
    page.wait_for_url(re.compile(r"/bookings/\d+/$"), timeout=30_000)
    booking = Booking.objects.get()
    assert (booking.gpu_fraction, booking.gpu_memory_mib) == (0.25, 20480)
    assert "shared GPU" in page.inner_text("body")
