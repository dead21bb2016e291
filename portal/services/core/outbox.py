"""The outbox: a command records its facts; subscribers act on them after commit.

A command calls `fact_record` inside its transaction: one DomainEvent row, nothing else (no
recipient read, no notification, no message). When the transaction commits, the rows it wrote
are handed to `portal.tasks.outbox_dispatch` (a Celery task: in-process in embedded mode), which
runs every subscriber registered for the fact's kind (`subscribe`, called at app start in
PortalConfig.ready), each in its own short transaction. A rolled-back command leaves no row, so
nothing is sent for it.

Claims are compare-and-set on the row (`claimed_until`), so the after-commit dispatch and the
periodic sweep never run one fact twice at the same time. A fact whose dispatch never ran (the
process died between commit and dispatch, the broker was down) is found by `outbox_sweep`.

A subscriber that raises is logged and retried at the next sweep; the subscribers that succeeded
are named in the row's `done` (written in the subscriber's own transaction) and are not run
again. Subscribers are idempotent by the fact's id all the same (a notification is keyed by it),
so a dispatcher dying between a subscriber's commit and the row's update sends nothing twice.
"""

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from portal.models import DomainEvent
from portal.services.core import counters
from portal.services.core.jobs import job_enqueue

log = logging.getLogger(__name__)

Handler = Callable[[DomainEvent], None]

# A claim lapses after this: a dispatcher that died leaves the fact to the next sweep.
CLAIM_S = 60
# The sweep leaves young facts to their own after-commit dispatch.
SWEEP_GRACE_S = 10
SWEEP_BATCH = 500
# Dispatched facts are kept this long for whoever looks into what was sent, then deleted.
KEEP_DAYS = 7
# A fact whose subscriber keeps failing is retried with a growing wait (RETRY_BASE_S doubled per
# attempt, at most RETRY_MAX_S), and after MAX_ATTEMPTS no more: it stays undispatched, with
# its last error, for an admin to look at (/admin/ Domain events, the gpu_portal_outbox_given_up_total counter on /metrics).
RETRY_BASE_S = 30
RETRY_MAX_S = 3600
MAX_ATTEMPTS = 12

_subscribers: dict[str, list[tuple[str, Handler]]] = {}


def subscribe(kind: str, handler: Handler) -> None:
    """Run `handler(fact)` after commit for every fact of `kind` (registered at app start)."""
    name = f"{handler.__module__}.{handler.__qualname__}"
    handlers = _subscribers.setdefault(kind, [])
    if all(existing != name for existing, _ in handlers):
        handlers.append((name, handler))


def unsubscribe(kind: str, handler: Handler) -> None:
    """Stop running `handler` for `kind` (tests that add a subscriber of their own)."""
    name = f"{handler.__module__}.{handler.__qualname__}"
    _subscribers[kind] = [(n, h) for n, h in _subscribers.get(kind, []) if n != name]


def fact_record(
    *,
    kind: str,
    booking_id: int | None = None,
    node_id: int | None = None,
    payload: dict | None = None,
    now: datetime | None = None,
) -> DomainEvent:
    """Record one fact in the caller's transaction; it is dispatched once that commits."""
    fact = DomainEvent.objects.create(
        kind=kind,
        booking_id=booking_id,
        node_id=node_id,
        payload=payload or {},
        created_at=now or timezone.now(),
    )
    transaction.on_commit(lambda: _dispatch_later(fact.pk), robust=True)
    return fact


def _dispatch_later(fact_id: int) -> None:
    try:
        job_enqueue("outbox_dispatch", [fact_id])
    except LookupError:  # nothing wired (a script without the app): the sweep sends it
        pass


def facts_dispatch(*, fact_ids, now: datetime | None = None) -> int:
    """Run the subscribers of each fact not yet dispatched and claimed by nobody else; returns
    how many facts are now fully dispatched."""
    dispatched = 0
    for fact_id in sorted(fact_ids):
        if _dispatch_one(fact_id, now or timezone.now()):
            dispatched += 1
    return dispatched


def outbox_sweep(*, now: datetime) -> int:
    """Dispatch the facts left undispatched (a dispatcher that died, a failed subscriber), and
    forget those dispatched more than KEEP_DAYS ago; returns how many it dispatched."""
    DomainEvent.objects.filter(dispatched_at__lt=now - timedelta(days=KEEP_DAYS)).delete()
    left = (
        DomainEvent.objects.filter(dispatched_at=None, created_at__lt=now - _seconds(SWEEP_GRACE_S))
        .filter(Q(claimed_until=None) | Q(claimed_until__lt=now), attempts__lt=MAX_ATTEMPTS)
        .order_by("id")
        .values_list("pk", flat=True)[:SWEEP_BATCH]
    )
    return facts_dispatch(fact_ids=list(left), now=now)


def retry_wait_s(attempts: int) -> float:
    """How long a fact waits after its `attempts`-th failed dispatch before the sweep tries again."""
    return min(RETRY_BASE_S * 2 ** (attempts - 1), RETRY_MAX_S)


def _seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


def _claim(fact_id: int, now: datetime) -> bool:
    free = Q(claimed_until=None) | Q(claimed_until__lt=now)
    claimed = DomainEvent.objects.filter(free, pk=fact_id, dispatched_at=None).update(
        claimed_until=now + _seconds(CLAIM_S)
    )
    return bool(claimed)


def _dispatch_one(fact_id: int, now: datetime) -> bool:
    if not _claim(fact_id, now):
        return False  # dispatched already, or another dispatcher holds it
    fact = DomainEvent.objects.get(pk=fact_id)
    failed = ""
    for name, handler in _subscribers.get(fact.kind, []):
        if name in fact.done:
            continue
        try:
            with transaction.atomic():
                handler(fact)
                done = [*fact.done, name]
                DomainEvent.objects.filter(pk=fact_id).update(done=done)
            fact.done = done
        except Exception as exc:  # retried at the next sweep; the other subscribers still run
            log.exception("subscriber %s failed on fact %s", name, fact_id)
            failed = failed or f"{name}: {exc}"[:300]
    if failed:
        # The claim becomes the wait before the next try: the sweep skips a fact until then.
        attempts = fact.attempts + 1
        DomainEvent.objects.filter(pk=fact_id).update(
            claimed_until=now + _seconds(retry_wait_s(attempts)),
            attempts=F("attempts") + 1,
            last_error=failed,
        )
        if attempts >= MAX_ATTEMPTS:
            counters.counter_add("outbox_given_up")
            log.error("fact %s given up after %s attempts: %s", fact_id, attempts, failed)
        return False
    DomainEvent.objects.filter(pk=fact_id).update(
        dispatched_at=timezone.now(), claimed_until=None, attempts=F("attempts") + 1
    )
    return True
