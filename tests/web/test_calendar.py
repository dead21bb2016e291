"""The calendar: a day or a week, hour marks, bookings as labelled blocks, and only free slots
that can be booked offered as links to Book."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.models import Booking, Node
from portal.web import calendar
from tests.factories import AllocationFactory, BookingFactory, make_mig_gpu, make_node

T0 = datetime(2030, 1, 7, tzinfo=UTC)  # a Monday


def _window(view="day"):
    return calendar.calendar_window(view=view, value="2030-01-07", now=T0)


@pytest.mark.parametrize(
    ("now", "held", "bookable", "starts"),
    [
        (T0 - timedelta(days=1), [], True, list(range(24))),
        (T0 + timedelta(hours=20, minutes=1), [], True, [21, 22, 23]),
        (T0, [(T0 + timedelta(hours=1, minutes=30), T0 + timedelta(hours=22))], True, [0, 22, 23]),
        (T0, [], False, []),
    ],
)
def test_it_offers_only_future_unheld_slots_on_up_nodes(now, held, bookable, starts):
    slots = calendar.free_slots(window=_window(), now=now, held=held, bookable=bookable)
    assert [s.start.hour for s in slots] == starts
    assert all(s.end - s.start == timedelta(hours=1) for s in slots)


def test_it_offers_the_rest_of_the_slot_under_way_from_the_next_hour():
    now = T0 + timedelta(hours=13, minutes=20)
    slots = calendar.free_slots(window=_window("week"), now=now, held=[], bookable=True)
    assert (slots[0].start, slots[0].end) == (T0 + timedelta(hours=14), T0 + timedelta(hours=16))
    now = T0 + timedelta(hours=15, minutes=20)
    slots = calendar.free_slots(window=_window("week"), now=now, held=[], bookable=True)
    assert slots[0].start == T0 + timedelta(hours=16)


def test_it_cuts_a_week_into_days_and_four_hour_slots():
    window = _window("week")
    assert (window.since, window.until - window.since) == (T0, timedelta(days=7))
    slots = calendar.free_slots(window=window, now=T0, held=[], bookable=True)
    assert len(slots) == 42 and slots[1].start == T0 + timedelta(hours=4)
    marks = calendar.ticks(window)
    assert [m["moment"].hour for m in marks[:5]] == [0, 6, 12, 18, 0]
    assert sum(m["day_start"] for m in marks) == 7
    day = calendar.calendar_window(view="day", value="2030-01-09", now=T0)
    assert (day.previous.isoformat(), day.next.isoformat()) == ("2030-01-08", "2030-01-10")


@pytest.fixture
def client_in(client, user, project):
    client.force_login(user)
    return client


def _row(body: str, uuid: str) -> str:
    return body.split(f'data-uuid-row="{uuid}"', 1)[1].split('<div class="tl-row"', 1)[0]


@pytest.fixture
def day_after_tomorrow():
    return (timezone.now() + timedelta(days=2)).replace(hour=0, minute=0, second=0, microsecond=0)


def test_it_draws_a_day_hour_by_hour_and_offers_only_free_hours(
    client_in, user, project, cluster, day_after_tomorrow
):
    day = day_after_tomorrow
    gpu, other = cluster[0].gpus.order_by("index")[:2]
    booking = BookingFactory(owner=user, project=project, state=Booking.State.PLANNED)
    AllocationFactory(
        booking=booking, gpu=gpu, start=day + timedelta(hours=10), end=day + timedelta(hours=13)
    )
    body = client_in.get(f"/calendar/?view=day&day={day:%Y-%m-%d}").content.decode()
    assert body.count('class="tl-tick tl-tick-hour"') == 24
    row = _row(body, gpu.uuid)
    for hour, offered in ((9, True), (10, False), (12, False), (13, True)):
        link = f"/book/?start={day:%Y-%m-%d}T{hour:02d}:00&amp;end={day:%Y-%m-%d}T{hour + 1:02d}:00"
        assert (link in row) is offered, hour
        assert link in _row(body, other.uuid)
    # The booking is a labelled block that links to it.
    assert f'href="/bookings/{booking.pk}/"' in row
    assert f"#{booking.pk} alice · vision" in row


def test_it_offers_nothing_in_the_past_or_on_a_down_node(client_in, cluster):
    down = make_node("node-down", gpus=1, state=Node.State.DOWN)
    yesterday = timezone.now() - timedelta(days=1)
    body = client_in.get(f"/calendar/?view=day&day={yesterday:%Y-%m-%d}").content.decode()
    assert "/book/?start=" not in body
    body = client_in.get("/calendar/?week=2099-01-05").content.decode()
    assert "Node down: not bookable" in body
    assert "/book/?start=" not in _row(body, down.gpus.get().uuid)
    assert "/book/?start=2099-01-05T00:00" in _row(body, cluster[0].gpus.first().uuid)


def test_it_keeps_the_slices_of_a_booked_whole_gpu_unoffered(
    client_in, user, project, cluster, day_after_tomorrow
):
    gpu = make_mig_gpu(cluster[0], 8)
    booking = BookingFactory(owner=user, project=project, state=Booking.State.PLANNED)
    AllocationFactory(
        booking=booking,
        gpu=gpu,
        start=day_after_tomorrow,
        end=day_after_tomorrow + timedelta(days=1),
    )
    body = client_in.get(f"/calendar/?view=day&day={day_after_tomorrow:%Y-%m-%d}").content.decode()
    for mig in gpu.mig_instances.all():
        assert "/book/?start=" not in _row(body, mig.uuid)


def test_it_links_each_day_of_the_week_to_its_day_view(client_in, cluster):
    body = client_in.get("/calendar/?week=2030-01-09").content.decode()
    assert "week of 7 Jan 2030" in body
    assert body.count('href="?view=day&amp;day=2030-01-') == 7
    assert 'href="?week=2030-01-14"' in body and 'href="?week=2029-12-31"' in body
