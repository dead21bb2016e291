"""The booking state transition table is the one owner of which moves are allowed, and the
database refuses a state that is not one of Booking.State's values."""

import ast
import itertools
from pathlib import Path

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.models import Booking
from portal.services.booking.bookings import booking_stop
from portal.services.booking.transitions import TRANSITIONS, booking_cas, transition_sources
from tests.factories import BookingFactory

pytestmark = [pytest.mark.django_db, pytest.mark.both_databases]

State = Booking.State
PAIRS = list(itertools.product(State.values, State.values))


@pytest.mark.parametrize(("source", "target"), PAIRS)
def test_it_moves_a_booking_only_along_the_table(source, target):
    booking = BookingFactory(state=source)
    allowed = target in TRANSITIONS[source]

    assert booking_cas(booking.pk, to=target) is allowed

    booking.refresh_from_db()
    assert booking.state == (target if allowed else source)


def test_it_has_a_row_for_every_state_and_only_known_targets():
    assert set(TRANSITIONS) == set(State.values)
    assert set().union(*TRANSITIONS.values()) <= set(State.values)
    assert transition_sources(State.CANCELLED) == tuple(sorted(Booking.LIVE_STATES))


def test_it_refuses_an_unknown_state_in_the_database():
    booking = BookingFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Booking.objects.filter(pk=booking.pk).update(state="limbo")
    booking.refresh_from_db()
    assert booking.state == State.PENDING


def test_it_does_not_stop_a_booking_the_table_does_not_let_stop():
    booking = BookingFactory(state=State.PENDING)

    stopped = booking_stop(booking_id=booking.pk, to=State.PREEMPTED, now=timezone.now(), detail="")

    assert stopped is None
    booking.refresh_from_db()
    assert booking.state == State.PENDING


def _booking_state_writes(tree: ast.AST):
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "update" or not any(k.arg == "state" for k in node.keywords):
            continue
        if "Booking" in ast.unparse(node.func.value):
            yield node.lineno


def test_it_writes_booking_state_only_through_the_table():
    portal = Path(__file__).resolve().parents[2] / "portal"
    found = []
    for path in portal.rglob("*.py"):
        if "migrations" in path.parts or path.name == "transitions.py":
            continue
        tree = ast.parse(path.read_text())
        found += [f"{path.relative_to(portal)}:{line}" for line in _booking_state_writes(tree)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "SET state = '" not in node.value, path
    assert found == []
