"""The one locking helper for the booking path.

Rules: lock late and once per transaction, inside transaction.atomic(durable=True), in one
order so two writers never wait on each other in a cycle: the quota subjects first (sorted
transaction-level advisory locks, ``lock_quota_subjects``), then node rows in ascending id
order, then booking rows; each with a short lock_timeout, so a stuck writer turns into a clear
"busy" (503) instead of a hung request. Always re-read what the lock protects after taking it.

Devices are not locked at all: the exclusion constraint on allocations
(``ALLOCATION_CONSTRAINT``) arbitrates, and a writer that loses (``is_allocation_clash``) places
again or gives up. Node rows hold only the node's state (heartbeats are kept apart, in
``NodeHeartbeat``), so a share lock on them (``share_lock_nodes``) waits only for a node
changing state, never for an agent's report.
"""

from collections.abc import Iterable

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection

from portal.errors import Busy
from portal.models import Node
from portal.services.core import counters

ALLOCATION_CONSTRAINT = "portal_allocation_no_overlap"  # migrations 0002 and 0004

# Advisory keys, two int4 each: (-1, project) for a project's quota, (project, user) for a
# user's quota in that project. Ids are positive, so the two kinds never meet, and the
# single-bigint keys of try_session_advisory_lock live in another key space.
_PROJECT_SUBJECT = -1


def quota_subjects(*, project_id: int, user_id: int | None = None) -> list[tuple[int, int]]:
    """The advisory keys of a booking's quota subjects, sorted (the order they are locked in)."""
    keys = [(_PROJECT_SUBJECT, project_id)]
    if user_id is not None:
        keys.append((project_id, user_id))
    return sorted(keys)


def lock_quota_subjects(*, project_id: int, user_id: int | None = None) -> None:
    """Hold the quota of a project (and of a user in it) until the transaction ends.

    Every writer that adds use (a reservation, a start, an extension) takes these first, so the
    one that comes second re-reads the use with the first's allocations in it. Transaction-level
    advisory locks: no row is locked, so nothing that merely reads or updates the project waits.
    PostgreSQL only; SQLite runs one writer at a time anyway.
    """
    if connection.vendor != "postgresql":
        return
    statements = [f"SET LOCAL lock_timeout = '{int(settings.BOOKING_LOCK_TIMEOUT_MS)}ms'"]
    statements += [
        f"SELECT pg_advisory_xact_lock({int(a)}, {int(b)})"
        for a, b in quota_subjects(project_id=project_id, user_id=user_id)
    ]
    try:
        with connection.cursor() as cursor:
            cursor.execute("; ".join(statements))  # integers only: one round trip
    except OperationalError as exc:
        counters.counter_add("lock_timeouts")
        raise Busy("The booking system is busy; try again in a few seconds.") from exc


def share_lock_nodes(node_ids: Iterable[int]) -> set[int]:
    """Share-lock the given nodes' rows (sorted) and return those of them that are up.

    Held to commit: a node cannot go down or drain while a booking is placed on it (its state
    change waits), and two bookings placed on one node do not wait for each other.
    """
    ids = sorted(set(node_ids))
    _set_lock_timeout()
    try:
        rows = _share_locked(ids)
    except OperationalError as exc:
        counters.counter_add("lock_timeouts")
        raise Busy("The booking system is busy; try again in a few seconds.") from exc
    return {node_id for node_id, state in rows if state == Node.State.UP}


def _share_locked(ids: list[int]) -> list[tuple[int, str]]:
    if connection.vendor != "postgresql":
        return list(Node.objects.filter(id__in=ids).values_list("id", "state"))
    with connection.cursor() as cursor:
        # The ORM has no FOR SHARE.
        cursor.execute(
            f"SELECT id, state FROM {Node._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR SHARE",
            [ids],
        )
        return cursor.fetchall()


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

    The exclusion constraint says so with an IntegrityError naming it (only that constraint
    counts), or, when two transactions insert clashing rows at the same moment, PostgreSQL may
    break the tie with a deadlock error instead. Either way the loser's write did not happen.
    """
    import psycopg

    cause = exc.__cause__
    if isinstance(exc, IntegrityError):
        # By name: any other constraint (an idempotency key, a foreign key) is not a clash.
        diag = getattr(cause, "diag", None)
        return getattr(diag, "constraint_name", None) == ALLOCATION_CONSTRAINT
    return isinstance(exc, OperationalError) and isinstance(cause, psycopg.errors.DeadlockDetected)


def is_contention(exc: Exception) -> bool:
    """True for a lock timeout or a deadlock: the write did not happen and a retry may succeed."""
    import psycopg

    cause = exc.__cause__
    return isinstance(exc, OperationalError) and isinstance(
        cause, psycopg.errors.LockNotAvailable | psycopg.errors.DeadlockDetected
    )
