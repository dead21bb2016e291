from django.apps import AppConfig


class PortalConfig(AppConfig):
    name = "portal"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Logins and failed logins are written to the audit log; cached token -> user entries
        # are dropped the moment a token or its user changes.
        from portal import audit_signals  # noqa: F401
        from portal.api import auth  # noqa: F401

        _subscribe()


def _subscribe() -> None:
    """The one list of what runs after a fact commits (portal.services.core.outbox)."""
    from portal.services.booking import events, project_reservations
    from portal.services.core.jobs import job_set
    from portal.services.core.outbox import subscribe
    from portal.services.fleet import agents, maintenance
    from portal.services.inventory import mig_layouts
    from portal.services.notify import maintenance as maintenance_notify
    from portal.services.notify import notifications
    from portal.services.realtime import live
    from portal.web import overview

    # The jobs services queue by name (portal.services.core.jobs), each its Celery task; the
    # outbox hands facts just committed to "outbox_dispatch".
    for name in ("outbox_dispatch", "allocation_pass", "delivery_send", "node_alert_notify"):
        job_set(name, _celery_enqueue(name))

    subscribe(events.BOOKING_CHANGED, notifications.booking_fact_notify)
    subscribe(events.BOOKING_CHANGED, live.booking_fact_broadcast)
    subscribe(events.BOOKING_CHANGED, agents.booking_fact_push)
    subscribe(events.BOOKING_CHANGED, events.booking_fact_pass_request)
    # The overview's live patch reads the page's own view of devices (portal.web.selectors).
    subscribe(events.BOOKING_CHANGED, overview.overview_fact_patch)
    subscribe(events.NODE_DOWN, notifications.node_down_fact_notify)
    subscribe(events.NODE_DOWN, events.node_fact_pass_request)
    subscribe(events.NODE_CHANGED, events.node_fact_pass_request)
    subscribe(events.QUEUE_CHANGED, live.queue_fact_broadcast)
    subscribe(events.NODE_DOWN, overview.overview_fact_patch)
    subscribe(events.NODE_CHANGED, overview.overview_fact_patch)
    # A maintenance window made, changed or deleted: tell whom it collides with; re-plan.
    subscribe(maintenance.MAINTENANCE_CHANGED, maintenance_notify.maintenance_fact_notify)
    subscribe(maintenance.MAINTENANCE_CHANGED, events.node_fact_pass_request)
    subscribe(mig_layouts.MIG_LAYOUT_CHANGED, agents.mig_fact_push)
    subscribe(mig_layouts.MIG_LAYOUT_CHANGED, events.node_fact_pass_request)
    subscribe(
        project_reservations.RESERVATION_CHANGED, project_reservations.reservation_fact_pass_request
    )


def _celery_enqueue(task_name: str):
    """Queue portal.tasks.<task_name>, looked up at call time (tests replace its delay)."""

    def enqueue(*args, countdown: float | None = None) -> None:
        from portal import tasks

        task = getattr(tasks, task_name)
        if countdown is None:
            task.delay(*args)
        else:
            task.apply_async(args, countdown=countdown)

    return enqueue
