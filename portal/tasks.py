"""Celery tasks: they only wire. Load by id, call one service, handle retries."""

from celery import shared_task
from django.utils import timezone

from portal.models import Delivery
from portal.services.core import outbox
from portal.services.notify import notifications

# Idempotent jobs are acknowledged only when done, and put back if the process running them dies
# (SIGKILL, OOM): another worker runs them again. A notification delivery is one of them: its
# sender claims the row before sending, so a second run never sends a second copy.
IDEMPOTENT = {"ignore_result": True, "acks_late": True, "reject_on_worker_lost": True}


@shared_task(**IDEMPOTENT)
def allocation_pass() -> None:
    """One allocator pass (skipped if another is running)."""
    from portal.services.allocation.allocation import allocation_pass as run_pass

    run_pass(now=timezone.now())


# A fact's subscribers are idempotent by its id and a claim keeps two dispatchers apart, so a
# second run after a worker died is safe.
@shared_task(**IDEMPOTENT)
def outbox_dispatch(fact_ids: list[int]) -> None:
    """Run the subscribers of facts just committed (notify, live, agents, pass request)."""
    with notifications.recipients_cached():
        outbox.facts_dispatch(fact_ids=fact_ids)


@shared_task(**IDEMPOTENT)
def outbox_sweep() -> None:
    """Dispatch the facts left undispatched (a process died after commit, a subscriber failed)."""
    with notifications.recipients_cached():
        outbox.outbox_sweep(now=timezone.now())


@shared_task(**IDEMPOTENT)
def telemetry_rollup() -> None:
    """Roll raw telemetry up per minute, then prune raw samples and rollups past retention."""
    from portal.services.fleet.telemetry import telemetry_maintain

    telemetry_maintain(now=timezone.now())


@shared_task(**IDEMPOTENT)
def node_heartbeat_check() -> None:
    """Mark silent nodes down; fail or requeue their bookings."""
    from portal.services.fleet.nodes import nodes_heartbeat_check

    nodes_heartbeat_check(now=timezone.now())


@shared_task(**IDEMPOTENT)
def maintenance_cycle() -> None:
    """Drain the nodes of maintenance windows under way; return those of windows over."""
    from portal.services.fleet.maintenance import maintenance_cycle as cycle

    cycle(now=timezone.now())


@shared_task(ignore_result=True)
def node_alert_notify(alert_id: int) -> None:
    """Record the messages about a process an agent objected to (they are sent as deliveries)."""
    notifications.alert_notify(alert_id=alert_id)


# A delivery claims its row before sending (portal.services.notify.delivery), so running the task again
# after a worker died is safe: it sends only a delivery nobody has claimed.
@shared_task(bind=True, max_retries=None, **IDEMPOTENT)
def delivery_send(self, delivery_id: int) -> None:
    """Send one recorded notification delivery; retried with backoff while it fails."""
    from portal.services.notify.delivery import SendFailed, retry_backoff
    from portal.services.notify.delivery import delivery_send as send

    try:
        send(delivery_id=delivery_id, now=timezone.now())
    except SendFailed as exc:
        if self.request.is_eager:
            return  # in-process mode: the periodic scan sends it again when its backoff is over
        attempts = Delivery.objects.filter(pk=delivery_id).values_list("attempts", flat=True)
        raise self.retry(countdown=retry_backoff(attempts.first() or 1), exc=exc) from exc


@shared_task(**IDEMPOTENT)
def notifications_scan() -> None:
    """Starting soon, ending soon, planned start moved, budget; resend stuck deliveries."""
    from portal.services.notify.notify_scan import notifications_scan as scan

    scan(now=timezone.now())


@shared_task(**IDEMPOTENT)
def idle_reclaim() -> None:
    """Warn idle bookings, release the ones nobody kept (when the site turned it on)."""
    from portal.services.notify.reclaim import idle_reclaim_scan

    idle_reclaim_scan(now=timezone.now())
