"""The overview page: mine, the site's totals, free by model and the nodes, from the cached
summary (portal.web.overview); a node's devices when it is expanded.

The parts that are the same for everyone (totals, models, the node list) are rendered once per
summary and filter and kept in the cache beside it; only "mine" is rendered per request.
"""

import hashlib
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.core.cache import cache
from django.http import Http404, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import mark_safe

from portal.web import selectors
from portal.web.maintenance import windows_shown
from portal.web.overview import (
    Summary,
    expanded_nodes,
    facts_version,
    node_detail,
    node_device_rows,
    overview_summary,
    shown_nodes,
    summary_choices,
)
from portal.web.views import FILTERS, with_times

# "Mine" lists this many live bookings; the rest are a link away (My bookings).
MINE_SHOWN = 12
PARTS = {
    "devices": "portal/_nodes.html",
    "totals": "portal/_totals.html",
    "models": "portal/_models.html",
    "filters": "portal/_filters.html",
}


@login_required
def overview(request):
    """What is free by model and node, mine, the site's totals; ?fragment= one part of it, or
    ?fragment=node&node=<hostname> that node's devices."""
    now = timezone.now()
    filters = {name: request.GET.get(name, "") for name in FILTERS}
    fragment = request.GET.get("fragment")
    if fragment == "node":
        return _node_devices(request, now, filters)
    if fragment == "mine":
        return render(request, "portal/_mine.html", _mine_context(request, now))
    if fragment and (fragment not in PARTS or fragment == "filters"):
        raise Http404("No such fragment.")
    summary, site_rows = overview_summary(now=now)
    parts = _parts(request, summary, site_rows, filters, now)
    if fragment:
        return _html(request, parts[fragment])
    context = {
        "parts": parts,
        "filter_query": _filter_query(filters),
        "maintenance": windows_shown(now=now),
        **_mine_context(request, now),
    }
    return render(request, "portal/overview.html", context)


def _filter_query(filters: dict) -> str:
    return "&".join(f"{k}={v}" for k, v in filters.items() if v)


def _parts(request, summary: Summary, site_rows, filters: dict, now: datetime) -> dict:
    """The shared parts' HTML: from the cache, unless a node opens with its devices (whose
    booking links depend on who looks)."""
    expanded = expanded_nodes(summary, node=filters["node"])
    query = _filter_query(filters)
    digest = hashlib.sha256(query.encode()).hexdigest()[:16]
    key = f"overview:parts:{summary.version}:{summary.built_at}:{digest}"
    if not expanded:
        cached = _rendered.get(key) or cache.get(key)
        if cached is not None:
            _remember(key, cached)
            return {name: mark_safe(html) for name, html in cached.items()}
    device_rows = node_device_rows(now=now, hostnames=expanded, rows=site_rows, **filters)
    nodes = [
        (line, shown, device_rows.get(line.hostname))
        for line, shown in shown_nodes(summary, **filters)
    ]
    context = {
        "summary": summary,
        "nodes": nodes,
        "matched": sum(1 for _, shown, _ in nodes if shown),
        "totals": summary.totals,
        "filter_query": query,
        "collapsed": not expanded,
        "filters": filters,
        "choices": summary_choices(summary),
    }
    parts = {name: render_to_string(t, context, request) for name, t in PARTS.items()}
    if not expanded:
        rendered = {name: str(html) for name, html in parts.items()}
        cache.set(key, rendered, timeout=30)
        _remember(key, rendered)
    return {name: mark_safe(html) for name, html in parts.items()}


# The parts this process rendered or fetched last, by key (a key names one summary and filter).
_rendered: dict[str, dict[str, str]] = {}


def _remember(key: str, parts: dict[str, str]) -> None:
    if len(_rendered) >= 16:
        _rendered.clear()
    _rendered[key] = parts


def _html(request, html: str) -> HttpResponse:
    return HttpResponse(html)


def _mine_context(request, now: datetime) -> dict:
    mine = selectors.my_live_bookings(user=request.user, limit=MINE_SHOWN + 1)
    more = len(mine) > MINE_SHOWN
    return {"mine": with_times(mine[:MINE_SHOWN], now), "mine_more": more, "now": now}


def _node_devices(request, now: datetime, filters: dict):
    """One node's device rows, for the overview to show when the node is expanded."""
    version = facts_version()  # read first: what follows is at least this new
    found = node_detail(now=now, hostname=request.GET.get("node", ""), **{**filters, "node": ""})
    if found is None:
        raise Http404("No such node.")
    line, rows = found
    context = {"rows": rows, "line": line, "version": version, "now": now}
    context["maintenance"] = windows_shown(now=now, hostname=line.hostname)
    return render(request, "portal/_node_devices.html", context)
