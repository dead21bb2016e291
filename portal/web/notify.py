"""Pages of notifications: a one-click action's confirmation, Slack's buttons, the settings page.

An action link opens a page that only shows what it would do (a GET changes nothing, so a mail
scanner that follows links does no harm); its one button POSTs and the action is done then.
"""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from portal.errors import ApplicationError
from portal.models import Channel
from portal.services.access.audit import Via, source_of
from portal.services.notify.booking_links import ACTIONS, action_check, action_perform
from portal.services.notify.preferences import preferences_set
from portal.services.notify.selectors import preferences_get
from portal.services.notify.slack_requests import slack_request_valid

_PROBLEM_STATUS = {"invalid": 400, "gone": 404, "expired": 410, "used": 410, "changed": 409}


@require_http_methods(["GET", "POST"])
def booking_action(request, token: str):
    """Confirm (GET) or do (POST) what a message's link asks."""
    if request.method == "GET":
        check = action_check(token=token)
        return _page(request, check, done=False)
    try:
        check = action_perform(token=token, now=timezone.now(), source=source_of(request, Via.LINK))
    except ApplicationError as error:
        check = action_check(token=token)
        return _page(request, check, done=False, error=error.message, status=409)
    return _page(request, check, done=not check.problem)


def _page(request, check, *, done: bool, error: str = "", status: int | None = None):
    context = {
        "check": check,
        "label": ACTIONS.get(check.action, ""),
        "done": done,
        "error": error,
    }
    code = status or _PROBLEM_STATUS.get(check.problem, 200)
    return render(request, "portal/booking_action.html", context, status=code)


@csrf_exempt
@require_POST
def slack_interactivity(request):
    """Slack's request when someone presses a message's button: signed by Slack, checked here."""
    if not slack_request_valid(
        body=request.body,
        timestamp=request.headers.get("X-Slack-Request-Timestamp", ""),
        signature=request.headers.get("X-Slack-Signature", ""),
        now=timezone.now(),
    ):
        return HttpResponse("bad signature", status=401)
    try:
        payload = json.loads(request.POST.get("payload", ""))
        pressed = payload["actions"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return HttpResponse("no action", status=400)
    if pressed.get("action_id") == "open":
        return HttpResponse(status=200)
    try:
        check = action_perform(
            token=str(pressed.get("value", "")),
            now=timezone.now(),
            source=source_of(request, Via.SLACK),
        )
    except ApplicationError as error:
        return JsonResponse({"response_type": "ephemeral", "text": error.message})
    text = (
        check.problem_text or f"Done: {ACTIONS[check.action].lower()} (booking {check.booking.pk})."
    )
    return JsonResponse({"response_type": "ephemeral", "replace_original": False, "text": text})


@login_required
@require_http_methods(["GET", "POST"])
def notification_settings(request):
    """Which events reach me on which channel, and my Slack and webhook addresses."""
    current = preferences_get(user=request.user)
    errors = {}
    if request.method == "POST":
        choices = {
            row["event"]: {c: f"{row['event']}:{c}" in request.POST for c in Channel.values}
            for row in current["events"]
        }
        contact = {
            name: request.POST.get(name, "")
            for name in ("slack_user_id", "slack_webhook_url", "webhook_url")
        }
        if request.POST.get("webhook_secret"):
            contact["webhook_secret"] = request.POST["webhook_secret"]
        try:
            preferences_set(
                user=request.user,
                choices=choices,
                contact=contact,
                array_each_task="array_each_task" in request.POST,
            )
        except ApplicationError as error:
            errors = error.fields or {"": error.message}
        else:
            messages.success(request, "Notification settings saved.")
            return redirect("notification-settings")
    context = {"prefs": current, "channels": Channel.choices, "errors": errors}
    return render(
        request, "portal/notification_settings.html", context, status=400 if errors else 200
    )
