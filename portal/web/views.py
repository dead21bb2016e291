"""Browser pages: interfaces that read through selectors and write through the booking services.

A page that updates live is made of fragments; `?fragment=<name>` renders just that part, which
static/portal/live.js re-fetches when a booking or the queue changes.
"""

from datetime import datetime, time, timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.templatetags.static import static
from django.utils import timezone

from agents.protocol import LOG_TAIL_BYTES, output_file_name
from portal.models import Allocation, Booking, Gpu, Node, Project
from portal.services.access import permissions
from portal.services.booking.quotas import quota_position, usage_current
from portal.services.booking.selectors import session_view
from portal.services.inventory import selectors as inventory
from portal.services.reporting import accounting as accounting_services
from portal.web import calendar, calendar_reservations, charts, history, panels, selectors
from portal.web.maintenance import windows_shown
from portal.web.node_resources import booking_holds

FILTERS = ("model", "node", "state")
# How far back the staff panel looks for alerts whose process still runs.
STAFF_ALERTS_SINCE = timedelta(days=7)


def render_page(request, template: str, context: dict, fragments: dict[str, str]):
    """The whole page, or only the fragment named by ?fragment= (for live re-fetches)."""
    name = request.GET.get("fragment")
    if name:
        if name not in fragments:
            raise Http404("No such fragment.")
        return render(request, fragments[name], context)
    return render(request, template, context)


def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links: send them to the portal's icon."""
    response = HttpResponseRedirect(static("portal/icon.svg"))
    response["Cache-Control"] = "public, max-age=86400"
    return response


def with_times(bookings: list[Booking], now: datetime) -> list[Booking]:
    for booking in bookings:
        booking.time_left = selectors.time_left(booking, now)
        booking.length_s, booking.length_ran = selectors.booking_length(booking)
        booking.reason_text = selectors.pending_reason_text(booking.pending_reason)
        booking.hints = selectors.usage_hints(booking)
    return bookings


@login_required
def bookings(request):
    now = timezone.now()
    rows = with_times(selectors.bookings_for_page(user=request.user), now)
    context = {
        "live": [b for b in rows if b.state in Booking.LIVE_STATES],
        "past": [b for b in rows if b.state not in Booking.LIVE_STATES],
        "now": now,
    }
    return render_page(
        request, "portal/bookings.html", context, {"bookings": "portal/_bookings.html"}
    )


@login_required
def booking_detail(request, booking_id: int):
    now = timezone.now()
    booking = selectors.booking_for_page(user=request.user, booking_id=booking_id)
    if booking is None:
        raise Http404("No such booking among yours.")
    with_times([booking], now)
    allocations = [a for a in booking.allocations.all()]
    shown = [a for a in allocations if a.live] or allocations
    series, kept = _booking_history(booking, shown, now)
    is_mig = bool(shown) and all(a.mig_instance_id for a in shown)
    all_samples = [s for samples in series.values() for s in samples]
    context = {
        "booking": booking,
        "allocations": shown,
        "readings": selectors.latest_by_uuid([a.device_uuid for a in shown]),
        "charts": charts.device_charts(series, is_mig=is_mig) if booking.started_at else [],
        "history_kept": kept,
        "efficiency": charts.mean_utilization(all_samples),
        "processes_seen": selectors.processes_seen(booking_id=booking.pk),
        "is_mig": is_mig,
        "session": session_view(booking) if booking.owner_id == request.user.pk else None,
        "now": now,
        "log_tail_kib": LOG_TAIL_BYTES // 1024,
        "node_runs": selectors.node_runs_current(booking=booking) if booking.command else [],
        "output_file": output_file_name(booking.pk),
        "holds": booking_holds(booking, allocations, now=now),
        "topology": inventory.gpus_topology_text(
            [a.gpu for a in shown if a.mig_instance_id is None]
        ),
    }
    fragments = {"booking": "portal/_booking_state.html", "output": "portal/_booking_output.html"}
    return render_page(request, "portal/booking_detail.html", context, fragments)


def _booking_history(booking: Booking, allocations: list[Allocation], now: datetime):
    """Samples per device over the booking's own time (at most its last week)."""
    if not booking.started_at:
        return {}, True
    until = min(booking.ended_at or now, now)
    since = max(booking.started_at, until - timedelta(days=7))
    series = {}
    for allocation in allocations:
        samples = history.device_history(uuid=allocation.device_uuid, since=since, until=until)
        if samples is None:
            return {}, False
        series[allocation.device_label] = samples
    return series, True


@login_required
def gpu_detail(request, gpu_id: int):
    now = timezone.now()
    gpu = get_object_or_404(Gpu.objects.select_related("node"), pk=gpu_id)
    slices = list(gpu.mig_instances.order_by("-slices", "uuid"))
    chosen = next((m for m in slices if str(m.pk) == request.GET.get("slice")), None)
    uuid, label = (chosen.uuid, str(chosen)) if chosen else (gpu.uuid, str(gpu))
    range_name, since, until, range_error = history.range_window(
        request.GET.get("range", ""), now, request.GET.get("from", ""), request.GET.get("to", "")
    )
    samples = history.device_history(uuid=uuid, since=since, until=until)
    held = Allocation.objects.filter(gpu=gpu, start__lt=until, end__gt=since).filter(
        Q(live=True) | Q(booking__started_at__isnull=False)
    )
    if chosen:
        held = held.filter(Q(mig_instance=chosen) | Q(mig_instance__isnull=True))
    marks = [
        (max(a.start, since), min(a.end, until), f"#{a.booking_id} {a.booking.owner.username}")
        for a in held.select_related("booking__owner").order_by("start")[:50]
    ]
    upcoming = list(
        Allocation.objects.filter(gpu=gpu, live=True, end__gt=now)
        .select_related("booking__owner", "mig_instance")
        .order_by("start")[:20]
    )
    shown = {a.booking_id for a in upcoming}
    devices = {gpu.uuid: str(gpu), **{m.uuid: str(m) for m in slices}}
    readings = selectors.latest_by_uuid(list(devices))
    booked = {a.device_uuid for a in upcoming if a.start <= now}
    context = {
        "gpu": gpu,
        "row": selectors.device_row(now=now, gpu_id=gpu.pk, mig_id=chosen.pk if chosen else None),
        "processes_now": selectors.processes_now(devices, readings, booked),
        "processes_seen": selectors.processes_seen(
            devices=devices, since=now - timedelta(hours=24)
        ),
        "slices": slices,
        "chosen": chosen,
        "device_uuid": uuid,
        "device_label": label,
        "reading": readings.get(uuid),
        "range": range_name,
        "ranges": list(history.RANGES),
        "range_error": range_error,
        "since": since,
        "until": until,
        "history_kept": samples is not None,
        "charts": charts.device_charts(
            {label: samples or []}, is_mig=chosen is not None, marks=marks
        ),
        "upcoming": upcoming,
        "nvlink_peers": inventory.gpu_nvlink_peers(gpu=gpu),
        "maintenance": windows_shown(now=now, hostname=gpu.node.hostname),
        "visible_ids": set(
            selectors.visible_bookings(request.user)
            .filter(pk__in=shown)
            .values_list("pk", flat=True)
        ),
    }
    return render_page(
        request, "portal/gpu_detail.html", context, {"state": "portal/_device_state.html"}
    )


@login_required
def calendar_page(request):
    now = timezone.now()
    view = request.GET.get("view", "week")
    value = request.GET.get("day" if view == "day" else "week", "")
    window = calendar.calendar_window(view=view, value=value, now=now)
    since, until = window.since, window.until
    filters = {name: request.GET.get(name, "") for name in ("model", "node")}
    rows = selectors.filter_rows(selectors.device_rows(now=now), **filters)
    devices = [d for r in rows for d in (r.children or [r])]
    bars = calendar.week_bars(user=request.user, since=since, until=until)
    held = calendar.held_spans(since=since, until=until)
    maintenance = calendar.maintenance_bars(since=since, until=until)
    closed = calendar.maintenance_spans(since=since, until=until)
    for device in devices:
        device.bars = bars.get(device.uuid, [])
        device.maintenance = maintenance.get(device.node, [])
        device.slots = calendar.free_slots(
            window=window,
            now=now,
            held=held.get(device.uuid, []) + closed.get(device.node, []),
            bookable=device.node_state == Node.State.UP,
        )
    now_place = calendar.geometry(now, now + timedelta(seconds=1), since, until)
    context = {
        "window": window,
        "devices": devices,
        "ticks": calendar.ticks(window),
        "days": [since + timedelta(days=i) for i in range(7)],
        "planned": calendar.planned_starts(user=request.user, since=since, until=until),
        "since": since,
        "today": now.date(),
        "now_left": now_place[0] if now_place else None,
        "filters": filters,
        "filter_query": urlencode({k: v for k, v in filters.items() if v}),
        "choices": selectors.filter_choices(),
        "reservations": calendar_reservations.reservation_bars(
            user=request.user, since=since, until=until, now=now
        ),
    }
    return render_page(
        request, "portal/calendar.html", context, {"timeline": "portal/_timeline.html"}
    )


@login_required
def queue(request):
    rows = panels.queue_rows(user=request.user)
    context = {"rows": rows, "total": panels.queue_length(), "now": timezone.now()}
    return render_page(request, "portal/queue.html", context, {"queue": "portal/_queue.html"})


@login_required
def staff_panel(request):
    if not permissions.can(request.user, "staff.panel"):
        raise PermissionDenied("Staff only.")
    now = timezone.now()
    alerts = panels.open_alerts(since=now - STAFF_ALERTS_SINCE)
    context = {
        "nodes": panels.node_lines(alerts=alerts),
        "alerts": alerts,
        "alerts_since": now - STAFF_ALERTS_SINCE,
        "now": now,
    }
    return render(request, "portal/staff.html", context)


@login_required
def project_detail(request, slug: str):
    project = get_object_or_404(Project, slug=slug)
    if not permissions.can(request.user, "project.view", project_id=project.pk):
        raise Http404("No such project among yours.")
    now = timezone.now()
    # The limits every quota path judges by: the project's, and the viewer's in the project.
    position = quota_position(project=project, user=request.user, now=now, use=False)
    limits, mine = position.project_limits, position.user_limits
    period = limits.budget_period_days
    first_day = (now - timedelta(days=29)).date()
    since = datetime.combine(first_day, time.min, tzinfo=now.tzinfo)
    rows = [
        (user, start, min(end, now), fraction)
        for user, start, end, fraction in Allocation.objects.filter(
            booking__project=project, start__lt=now, end__gt=since
        ).values_list("booking__owner__username", "start", "end", "fraction")
    ]
    dates, series = charts.daily_gpu_hours(rows, first_day=first_day, days=30)
    members = project.memberships.select_related("user").order_by("user__username")
    context = {
        "project": project,
        "limits": limits,
        "mine": mine,
        "usage": usage_current(project=project, now=now, period_days=period),
        "my_usage": usage_current(
            project=project, user=request.user, now=now, period_days=mine.budget_period_days
        ),
        "members": [(m, round(sum(series.get(m.user.username, [])), 1)) for m in members],
        "hours_figure": charts.member_hours_figure(dates, series) if series else None,
        "may_audit": permissions.can(request.user, "audit.view", project_id=project.pk),
    }
    return render(request, "portal/project.html", context)


ACCOUNTING_PRESETS = {
    "this-month": "This month",
    "last-month": "Last month",
    "30d": "Last 30 days",
    "7d": "Last 7 days",
}


def _accounting_period(request, now: datetime) -> tuple[str, datetime, datetime, str]:
    """(preset or "custom", since, until, error) from ?period= or ?from=&to= (dates, UTC)."""
    preset = request.GET.get("period", "")
    start_of_month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if preset == "last-month":
        previous = (start_of_month - timedelta(days=1)).replace(day=1)
        return preset, previous, start_of_month, ""
    if preset in ("30d", "7d"):
        return preset, now - timedelta(days=int(preset[:-1])), now, ""
    if request.GET.get("from"):
        try:
            since = _moment(request.GET["from"], now, end_of_day=False)
            until = (
                _moment(request.GET["to"], now, end_of_day=True) if request.GET.get("to") else now
            )
        except ValueError:
            return "this-month", start_of_month, now, "Dates are YYYY-MM-DD (or ISO 8601 times)."
        if since >= until:
            return "this-month", start_of_month, now, "The start must be before the end."
        return "custom", since, until, ""
    return "this-month", start_of_month, now, ""


def _moment(text: str, now: datetime, *, end_of_day: bool) -> datetime:
    """A date (the start of it; with end_of_day the start of the next) or an ISO time, UTC."""
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=now.tzinfo)
    if "T" not in text and end_of_day:
        value += timedelta(days=1)
    return value


@login_required
def accounting(request):
    now = timezone.now()
    preset, since, until, error = _accounting_period(request, now)
    group_by = request.GET.get("group_by", "project")
    if group_by not in accounting_services.GROUPS:
        group_by = "project"
    rows = accounting_services.accounting_report(
        since=since, until=until, group_by=group_by, now=now, user=request.user
    )
    export = {"group_by": group_by, "from": since.isoformat(), "to": min(until, now).isoformat()}
    context = {
        "rows": rows,
        "totals": accounting_services.report_totals(rows),
        "group_by": group_by,
        "groups": accounting_services.GROUPS,
        "preset": preset,
        "presets": ACCOUNTING_PRESETS,
        "since": since,
        "until": min(until, now),
        "error": error,
        "charts": charts.accounting_figures(rows, group_by) if rows else [],
        "csv_url": "/api/v1/accounting/?" + urlencode({**export, "format": "csv"}),
        "json_url": "/api/v1/accounting/?" + urlencode(export),
    }
    return render(request, "portal/accounting.html", context)
