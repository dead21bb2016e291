"""The one locking helper for the booking path.

Rules: lock late and once per transaction, inside transaction.atomic(durable=True), node
rows in ascending id order (after the project row, before booking rows) so two writers never
wait on each other in a cycle, with a short lock_timeout so a stuck writer turns into a clear "busy" (503) instead of a hung request. Always
re-read availability after taking the lock. The exclusion constraint on allocations is the
backstop if a path forgets.
"""

from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection

from portal.errors import Busy
from portal.models import Node, Project
from portal.services.core import counters


def lock_project(project_id: int) -> None:
    """Lock a project's row, so the quota checks of its reservations run one at a time.

    Reservations of different GPU models lock disjoint nodes; only this lock makes the second
    one see the first's allocations. Taken before any node (the order: project, then nodes).
    """
    _set_lock_timeout()
    try:
        list(Project.objects.select_for_update().filter(id=project_id).values_list("id"))
    except OperationalError as exc:
        counters.counter_add("lock_timeouts")
        raise Busy("The booking system is busy; try again in a few seconds.") from exc


def _set_lock_timeout() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = %s", [f"{settings.BOOKING_LOCK_TIMEOUT_MS}ms"])


def lock_nodes(node_ids: Iterable[int]) -> list[int]:
    """Lock the given nodes' rows (sorted); returns the ids locked. Raises Busy on timeout."""
    ids = sorted(set(node_ids))
    _set_lock_timeout()
    try:
        return list(
            Node.objects.select_for_update()
            .filter(id__in=ids)
            .order_by("id")
            .values_list("id", flat=True)
        )
    except OperationalError as exc:
        counters.counter_add("lock_timeouts")
        raise Busy("The booking system is busy; try again in a few seconds.") from exc


def try_session_advisory_lock(key: int) -> bool:
    """Take a session-level advisory lock without waiting (PostgreSQL); True elsewhere.

    Outlives the transactions taken while it is held (the pass commits each start on its own);
    release it with advisory_unlock. A dropped connection releases it too.
    """
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [key])
        return bool(cursor.fetchone()[0])


def advisory_unlock(key: int) -> None:
    """Release a session-level advisory lock taken by try_session_advisory_lock."""
    if connection.vendor != "postgresql":
        return
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
    except OperationalError:
        # The connection is gone, and the lock with it.
        connection.close()


def is_allocation_clash(exc: Exception) -> bool:
    """True for the database refusing overlapping allocations.

    The exclusion constraint says so with an IntegrityError, or, when two transactions insert
    clashing rows at the same moment, PostgreSQL may break the tie with a deadlock error instead.
    Either way the loser's write did not happen.
    """
    import psycopg

    if isinstance(exc, IntegrityError):
        return True
    return isinstance(exc, OperationalError) and isinstance(
        exc.__cause__, psycopg.errors.DeadlockDetected
    )


def is_contention(exc: Exception) -> bool:
    """True for a lock timeout or a deadlock: the write did not happen and a retry may succeed."""
    import psycopg

    cause = exc.__cause__
    return isinstance(exc, OperationalError) and isinstance(
        cause, psycopg.errors.LockNotAvailable | psycopg.errors.DeadlockDetected
    )
