"""Telling people about a maintenance window: the owners of the bookings it collides with."""

from django.utils import timezone

from portal.models import Booking, Event
from portal.services.notify.notifications import notification_record


def maintenance_fact_notify(fact) -> None:
    """Subscriber: each owner of a running or planned booking a window (created or changed)
    collides with hears of it, once per fact and booking. The planned starts it moves are told
    by the planned-start-moved scan, with the window as the reason."""
    payload = fact.payload
    context = {key: payload.get(key) for key in ("window", "change", "reason", "start", "end")}
    context["nodes"] = payload.get("nodes", [])
    bookings = Booking.objects.filter(pk__in=payload.get("collisions", [])).select_related(
        "owner", "project"
    )
    for booking in bookings.order_by("pk"):
        notification_record(
            event=Event.MAINTENANCE,
            booking=booking,
            now=timezone.now(),
            context=context,
            key=f"maintenance:{fact.pk}:{booking.pk}",
        )
