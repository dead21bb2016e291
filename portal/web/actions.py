"""Pages that change things: the Book form and the cancel / release / extend buttons.

Each calls one booking service; a refusal (ApplicationError) is shown at the field it names, or
as a message on the page the user came from.
"""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from portal.errors import ApplicationError, NotFound
from portal.models import Project
from portal.services.access.audit import Via, source_of
from portal.services.booking import bookings as booking_services
from portal.web.forms import BookForm, ExtendForm, add_service_errors

PREFILL = ("start", "end", "gpu_model", "mig_profile", "kind", "when", "gpus", "project")


@login_required
def book(request):
    projects = list(
        Project.objects.filter(memberships__user=request.user)
        .order_by("slug")
        .values_list("slug", flat=True)
    )
    if request.method == "POST":
        form = BookForm(request.POST, projects=projects)
        if form.is_valid():
            try:
                booking = booking_services.booking_submit(
                    user=request.user,
                    now=timezone.now(),
                    source=source_of(request, Via.WEB),
                    **form.submit_kwargs(),
                )
            except ApplicationError as error:
                add_service_errors(form, error)
            else:
                booking.refresh_from_db()  # the allocation pass may have started it already
                messages.success(request, f"Booking {booking.pk} submitted: {booking.state}.")
                return redirect("booking-detail", booking_id=booking.pk)
        status = 400
    else:
        form = BookForm(initial=_prefill(request.GET), projects=projects)
        status = 200
    return render(request, "portal/book.html", {"form": form, "projects": projects}, status=status)


def _prefill(params) -> dict:
    initial = {name: params[name] for name in PREFILL if params.get(name)}
    if "start" in initial:
        initial["when"] = "window"
    if "mig_profile" in initial:
        initial["kind"] = "mig"
    return initial


def _back(request, booking_id: int):
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return redirect(target)
    return redirect(reverse("booking-detail", args=[booking_id]))


def _command(request, booking_id: int, service, done: str, **kwargs):
    try:
        service(
            user=request.user,
            booking_id=booking_id,
            now=timezone.now(),
            source=source_of(request, Via.WEB),
            **kwargs,
        )
    except NotFound as error:
        raise Http404(error.message) from error
    except ApplicationError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Booking {booking_id} {done}.")
    return _back(request, booking_id)


@login_required
@require_POST
def booking_cancel(request, booking_id: int):
    return _command(request, booking_id, booking_services.booking_cancel, "cancelled")


@login_required
@require_POST
def booking_release(request, booking_id: int):
    return _command(request, booking_id, booking_services.booking_release, "released")


@login_required
@require_POST
def booking_extend(request, booking_id: int):
    form = ExtendForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose how long to extend by.")
        return _back(request, booking_id)
    by_s = form.cleaned_data["by_hours"] * 3600
    return _command(request, booking_id, booking_services.booking_extend, "extended", by_s=by_s)
