"""Background jobs that services ask for, plugged in from above.

A service names the job it wants queued (`job_enqueue("delivery_send", delivery_id)`);
PortalConfig.ready maps each name to the Celery task that runs it (the outbox hands new facts
to "outbox_dispatch" this way too). So the services never import portal.tasks, which imports them.
"""

from __future__ import annotations

from collections.abc import Callable

Enqueue = Callable[..., None]

_jobs: dict[str, Enqueue] = {}


def job_set(name: str, enqueue: Enqueue) -> None:
    """Plug in how the job `name` is queued: `enqueue(*args, countdown=seconds or None)`."""
    _jobs[name] = enqueue


def job_enqueue(name: str, *args, countdown: float | None = None) -> None:
    """Queue the job `name` with positional `args`, after `countdown` seconds if given."""
    try:
        enqueue = _jobs[name]
    except KeyError:
        raise LookupError(f"no job {name!r} plugged in (PortalConfig.ready does it)") from None
    enqueue(*args, countdown=countdown)
