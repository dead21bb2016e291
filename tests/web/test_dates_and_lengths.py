"""Dates read 2026-12-03 08:05, the year always there; a finished booking's length is as it ran."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from portal.models import Booking
from portal.templatetags.portal_web import duration, when
from tests.factories import BookingFactory


@pytest.fixture
def client_in(client, user):
    client.force_login(user)
    return client


def test_it_shows_every_date_as_year_month_day_hour_minute():
    this_year = timezone.now().year
    assert when(datetime(this_year, 3, 3, 14, 5, tzinfo=UTC)) == f"{this_year}-03-03 14:05"
    assert when(datetime(this_year - 1, 3, 3, 14, 5, tzinfo=UTC)) == f"{this_year - 1}-03-03 14:05"
    assert when(datetime(2026, 12, 3, 8, 5, tzinfo=UTC)) == "2026-12-03 08:05"
    assert when(None) == ""


def test_it_shows_last_years_booking_with_its_year_and_how_long_it_ran(client_in, user, project):
    last_year = timezone.now().year - 1
    started = datetime(last_year, 12, 30, 22, 0, tzinfo=UTC)
    booking = BookingFactory(
        owner=user,
        project=project,
        state=Booking.State.FINISHED,
        duration_s=4 * 3600,
        submitted_at=started - timedelta(minutes=5),
        started_at=started,
        ended_at=started + timedelta(minutes=95),
    )
    page = client_in.get(f"/bookings/{booking.pk}/").content.decode()
    assert f"{last_year}-12-30 22:00" in page  # started
    assert f"{last_year}-12-30 23:35" in page  # ended
    assert "Ran for" in page
    assert '<dd id="booking-length">1 h 35 min <span class="muted">(booked 4 h)</span>' in page
    listing = client_in.get("/bookings/").content.decode()
    assert f"{last_year}-12-30 23:35" in listing


def test_it_shows_a_pending_bookings_length_as_asked_and_this_years_dates_with_the_year(
    client_in, user, project
):
    now = timezone.now()
    booking = BookingFactory(
        owner=user, project=project, duration_s=2 * 3600, submitted_at=now, started_at=None
    )
    page = client_in.get(f"/bookings/{booking.pk}/").content.decode()
    assert '<dd id="booking-length">2 h</dd>' in page
    assert "Ran for" not in page
    submitted = timezone.localtime(now)
    assert f"{submitted:%Y-%m-%d %H:%M} UTC" in page


def test_it_shows_a_run_under_a_minute_in_seconds_not_as_0_min():
    assert duration(31) == "31 s"
    assert duration(timedelta(seconds=59)) == "59 s"
    assert duration(60) == "1 min"
    assert duration(3660) == "1 h 1 min"
