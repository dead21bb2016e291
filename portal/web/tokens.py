"""The Tokens page (create, list, revoke my API tokens) and the Audit page (staff: everything;
project managers: their projects). Each write calls one service; the new key is shown once."""

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.errors import ApplicationError, NotFound
from portal.services.access import permissions
from portal.services.access import selectors as access_selectors
from portal.services.access import tokens as token_services
from portal.services.access.audit import ACTIONS, Via, source_of
from portal.web.forms import TokenForm, add_service_errors

NEW_KEY = "portal-new-token"  # session key holding a new token's key until it is shown once
AUDIT_PAGE_ROWS = 200


@login_required
def tokens(request):
    if request.method == "POST":
        form = TokenForm(request.POST)
        if form.is_valid():
            days = form.cleaned_data["expires_days"]
            now = timezone.now()
            try:
                raw, token = token_services.token_create(
                    user=request.user,
                    now=now,
                    name=form.cleaned_data["name"],
                    scope=form.cleaned_data["scope"],
                    expires_at=now + timedelta(days=days) if days else None,
                    source=source_of(request, Via.WEB),
                )
            except ApplicationError as error:
                add_service_errors(form, error)
            else:
                request.session[NEW_KEY] = {"id": token.pk, "key": raw}
                return redirect("tokens")
        status = 400
    else:
        form, status = TokenForm(), 200
    context = {
        "form": form,
        "tokens": access_selectors.tokens_of(user=request.user),
        "new": request.session.pop(NEW_KEY, None) if request.method == "GET" else None,
        "now": timezone.now(),
    }
    return render(request, "portal/tokens.html", context, status=status)


@login_required
@require_POST
def token_revoke(request, token_id: int):
    try:
        token = token_services.token_revoke(
            actor=request.user, token_id=token_id, source=source_of(request, Via.WEB)
        )
    except NotFound as error:
        raise Http404(error.message) from error
    messages.success(request, f"Token “{token.name or token.prefix}” revoked.")
    return redirect("tokens")


AUDIT_FILTERS = ("action", "actor", "project")


@login_required
def audit(request):
    if not permissions.can_some(request.user, "audit.view"):
        raise PermissionDenied("Only staff and project managers read the audit log.")
    filters = {name: request.GET.get(name, "").strip()[:150] for name in AUDIT_FILTERS}
    events = access_selectors.audit_events_filter(
        access_selectors.audit_events_visible(request.user), **filters
    )
    query = {k: v for k, v in filters.items() if v}
    context = {
        "events": list(events[:AUDIT_PAGE_ROWS]),
        "limit": AUDIT_PAGE_ROWS,
        "sees_all": permissions.can(request.user, "audit.view"),
        "filters": filters,
        "actions": ACTIONS,
        "csv_url": "/api/v1/audit/?" + urlencode({**query, "format": "csv"}),
    }
    return render(request, "portal/audit.html", context)
