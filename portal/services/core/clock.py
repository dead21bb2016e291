"""The one conversion between datetimes and seconds since the Unix epoch, in Python and in SQL.

The allocator works in epoch seconds (floats); the database and the rest of the portal in aware
datetimes. Everything that crosses between the two goes through here, so both directions and
both databases agree to the microsecond.
"""

from datetime import UTC, datetime

from django.db.models import FloatField, Func


def to_epoch(value: datetime) -> float:
    """Seconds since the epoch of a datetime (a naive one is read in TIME_ZONE, as Django sets
    the process's zone to it)."""
    return value.timestamp()


def from_epoch(seconds: float) -> datetime:
    """The aware UTC datetime `seconds` after the epoch."""
    return datetime.fromtimestamp(seconds, tz=UTC)


class EpochSeconds(Func):
    """Seconds since the epoch of a timestamp column or expression (PostgreSQL and SQLite)."""

    output_field = FloatField()

    def as_postgresql(self, compiler, connection, **extra):
        # EXTRACT gives numeric, which the driver would build a Decimal from for every row.
        return self.as_sql(
            compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8"
        )

    def as_sqlite(self, compiler, connection, **extra):
        # Django stores a timestamp as text, 'YYYY-MM-DD HH:MM:SS[.ffffff]' (its Cast writes
        # '.fff'). julianday() keeps milliseconds only (the allocator, comparing a submit time
        # plus its grace with the pass's clock, saw the submit up to a millisecond late), so it
        # gives the whole seconds (rounded; the epoch is Julian day 2440587.5) and the text the
        # microseconds; one division of the two integers rounds as Python's timestamp() does.
        # NULL in, NULL out.
        (source,) = self.get_source_expressions()
        sql, params = compiler.compile(source)
        micro = (
            f"(CASE WHEN substr({sql}, 20, 1) = '.' "
            f"THEN CAST(substr({sql} || '00000', 21, 6) AS INTEGER) ELSE 0 END)"
        )
        whole = f"round((julianday({sql}) - 2440587.5) * 86400.0 - {micro} / 1000000.0)"
        return f"(({whole} * 1000000 + {micro}) / 1000000.0)", tuple(params) * 5
