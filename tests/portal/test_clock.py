"""One conversion between datetimes and epoch seconds, the same in Python and in SQL."""

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.db.models import DateTimeField, Value
from django.db.models.functions import Cast

from portal.models import Booking
from portal.services.core.clock import EpochSeconds, from_epoch, to_epoch
from tests.factories import BookingFactory

pytestmark = pytest.mark.both_databases

MOMENTS = [
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2026, 12, 1, 20, 41, 7, 123456, tzinfo=UTC),
    datetime(2026, 12, 4, 23, 1, 28, 123956, tzinfo=UTC),  # julianday() read it as .124017
    datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(2027, 3, 28, 1, 30, tzinfo=timezone(timedelta(hours=2))),
]


@pytest.mark.parametrize("moment", MOMENTS)
def test_it_round_trips_a_datetime_through_epoch_seconds(moment):
    assert from_epoch(to_epoch(moment)) == moment
    assert from_epoch(to_epoch(moment)).tzinfo == UTC


def test_it_counts_seconds_from_the_unix_epoch():
    assert to_epoch(datetime(1970, 1, 2, tzinfo=UTC)) == 86400.0
    assert from_epoch(1.5) == datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=UTC)


@pytest.mark.django_db
@pytest.mark.parametrize("moment", MOMENTS)
def test_it_gives_the_same_seconds_in_sql_as_in_python_to_the_microsecond(moment):
    booking = BookingFactory(submitted_at=moment)
    row = Booking.objects.annotate(
        column=EpochSeconds("submitted_at"),
        literal=EpochSeconds(Value(moment, output_field=DateTimeField())),
        cast=EpochSeconds(Cast(Value(moment), DateTimeField())),
        empty=EpochSeconds("planned_start"),
    ).get(pk=booking.pk)

    # Exactly: the allocator compares a submit time plus its grace with the pass's own clock.
    assert row.column == to_epoch(moment)
    assert row.literal == to_epoch(moment)
    # SQLite's Cast keeps milliseconds ('%f'); PostgreSQL's keeps microseconds.
    assert row.cast == pytest.approx(to_epoch(moment), abs=1e-3)
    assert row.empty is None


def test_it_converts_epoch_seconds_nowhere_else_in_the_portal():
    portal = Path(__file__).resolve().parents[2] / "portal"
    own = [".timestamp()", "fromtimestamp(", "julianday(", "EXTRACT(EPOCH"]
    found = [
        f"{path.relative_to(portal)}: {needle}"
        for path in portal.rglob("*.py")
        if path.name != "clock.py" and "migrations" not in path.parts
        for needle in own
        if needle in path.read_text()
    ]
    assert found == []
