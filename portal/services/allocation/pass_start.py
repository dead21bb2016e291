"""Applying one start of the allocation pass: a short transaction that re-checks the snapshot.

The pass plans without locks, so by the time a start is applied its devices may have been taken,
its node may have gone down or its project may have got devices that the plan's quota check did
not see. The start takes its project's quota lock and locks its nodes (the booking path's order:
quota subjects, then nodes sorted), re-checks all of that under the locks, and only then writes;
otherwise it is left for the next pass. A fraction of a shared GPU is re-checked against the
shares and memory already on its GPU (inventory/sharing.py), whole devices against any live
allocation, and the cores and memory it takes on each node against what the others hold there
(inventory/resources.py). The exclusion constraint on allocations stays the backstop. On PostgreSQL the locks are two round trips and the check, the state change and the
allocations one statement.
"""

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Q

from portal.errors import Busy
from portal.models import Allocation, Booking, Gpu, MigInstance, Node, Project
from portal.services.allocation.snapshot import DeviceRow, PendingRow, Snapshot
from portal.services.booking import events
from portal.services.booking.transitions import booking_cas, transition_sources
from portal.services.core.locking import (
    is_allocation_clash,
    is_contention,
    lock_nodes,
    lock_quota_subjects,
    quota_subjects,
)
from portal.services.inventory import selectors as inventory
from portal.services.inventory.resources import resources_fit
from portal.services.inventory.sharing import share_fits
from portal.services.inventory.windows import window_in_the_way

log = logging.getLogger(__name__)
State = Booking.State


def start_planned(
    *,
    pending: PendingRow,
    rows: list[DeviceRow],
    snap: Snapshot,
    now: datetime,
    done: set[int],
    borrowed_past: str = "",
) -> bool:
    """Start a planned booking on these devices if the snapshot still holds; False: skipped.

    ``done`` holds the bookings this pass already started (their allocations are expected).
    ``borrowed_past``: it starts borrowed, past these limits ("project vision").
    """
    end = now + timedelta(seconds=pending.duration_s)
    start = _start_postgresql if connection.vendor == "postgresql" else _start_portable
    try:
        with transaction.atomic(durable=True):
            if not start(pending, rows, snap, now, end, done):
                return False
            if window_in_the_way(gpu_ids={row.gpu_id for row in rows}, start=now, end=end):
                # A maintenance window made since the snapshot: the next pass plans around it.
                transaction.set_rollback(True)
                return False
            if borrowed_past:
                _mark_borrowed(pending.pk, borrowed_past)
            events.booking_changed(Booking(pk=pending.pk), "started")
    except Busy:
        log.info("booking %s: its nodes are busy; retried next pass", pending.pk)
        return False
    except (IntegrityError, OperationalError) as exc:
        if is_contention(exc):
            log.info("booking %s: its nodes are busy; retried next pass", pending.pk)
            return False
        if not is_allocation_clash(exc):
            raise
        log.warning("booking %s: its devices were taken meanwhile; retried next pass", pending.pk)
        return False
    return True


def _mark_borrowed(booking_id: int, past: str) -> None:
    """The run just started is borrowed: the booking and its allocations say so."""
    Booking.objects.filter(pk=booking_id).update(
        borrowed=True,
        borrowed_past=past[:200],
        state_detail=f"borrowed past the {past} quota"[:300],
    )
    Allocation.objects.filter(booking_id=booking_id, live=True).update(borrowed=True)


_TABLES = {
    "project": Project._meta.db_table,
    "node": Node._meta.db_table,
    "gpu": Gpu._meta.db_table,
    "mig": MigInstance._meta.db_table,
    "alloc": Allocation._meta.db_table,
    "booking": Booking._meta.db_table,
}

# Under the locks: the nodes are up, the devices are live (not retired: see
# inventory.gpus_bookable) in the same MIG layout, nothing took them
# over [now, end), and no other booking of the project got devices since the snapshot. Then the
# booking becomes active (if the transition table lets it, and not extended since) and gets its
# allocations, in one statement.
_START_SQL = """
WITH valid AS (
  SELECT
    (SELECT count(*) FROM {node} WHERE id = ANY(%(nodes)s) AND state = 'up')
      = cardinality(%(nodes)s::bigint[])
    AND (SELECT count(*) FROM {gpu} WHERE id = ANY(%(whole)s) AND NOT mig_mode
         AND retired_at IS NULL AND sharing = 'exclusive') = cardinality(%(whole)s::bigint[])
    AND (SELECT count(*) FROM {mig} m JOIN {gpu} g ON g.id = m.gpu_id
         WHERE m.id = ANY(%(migs)s) AND g.mig_mode AND m.retired_at IS NULL
           AND g.retired_at IS NULL) = cardinality(%(migs)s::bigint[])
    AND NOT EXISTS (
      SELECT 1 FROM {alloc} a WHERE a.live AND a.start < %(end)s AND a."end" > %(now)s
        AND (a.gpu_id = ANY(%(whole)s) OR a.mig_instance_id = ANY(%(migs)s)
             OR (a.gpu_id = ANY(%(mig_gpus)s) AND a.mig_instance_id IS NULL)))
    AND NOT EXISTS (
      SELECT 1 FROM {alloc} a JOIN {booking} b ON b.id = a.booking_id
      WHERE a.id > %(last)s AND b.project_id = %(project)s
        AND NOT a.booking_id = ANY(%(done)s::bigint[])) AS ok
), started AS (
  UPDATE {booking} SET state = %(active)s, started_at = %(now)s, planned_start = %(now)s,
    queue_position = NULL, pending_reason = '', state_detail = ''
  WHERE id = %(booking)s AND state = ANY(%(sources)s::text[]) AND duration_s = %(duration)s
    AND (SELECT ok FROM valid)
  RETURNING id
)
INSERT INTO {alloc}
  (booking_id, gpu_id, mig_instance_id, start, "end", fraction, share, gpu_memory_mib, live,
   borrowed)
SELECT started.id, d.gpu, d.mig, %(now)s, %(end)s, d.fraction, d.share, d.memory, true, false
FROM started, unnest(%(gpus)s::bigint[], %(mig_or_null)s::bigint[], %(fractions)s::float8[],
  %(shares)s::float8[], %(memory)s::bigint[])
  AS d(gpu, mig, fraction, share, memory)
""".format(**_TABLES)


def _start_postgresql(pending, rows, snap, now, end, done) -> bool:
    nodes = sorted({row.node_id for row in rows})
    with connection.cursor() as cursor:
        # The ids are integers from our own snapshot. The quota subject first (the order every
        # booking writer keeps), then the nodes, in two round trips: with the advisory lock and
        # the row locks in one string, a node row held elsewhere was waited for past the
        # lock_timeout (test_inventory_history's retiring race).
        (subject,) = quota_subjects(project_id=pending.project_id)
        cursor.execute(
            f"SET LOCAL lock_timeout = '{int(settings.BOOKING_LOCK_TIMEOUT_MS)}ms';"
            f" SELECT pg_advisory_xact_lock({int(subject[0])}, {int(subject[1])})"
        )
        cursor.execute(
            f"SELECT id FROM {_TABLES['node']} WHERE id IN ({', '.join(map(str, nodes))})"
            " ORDER BY id FOR UPDATE"
        )
        if not _shares_fit(rows, now, end) or not _resources_fit(pending, rows, snap, now, end):
            return False
        cursor.execute(
            _START_SQL,
            {
                "nodes": nodes,
                "whole": [
                    row.gpu_id for row in rows if row.mig_id is None and row.memory_mib is None
                ],
                "migs": [row.mig_id for row in rows if row.mig_id is not None],
                "mig_gpus": [row.gpu_id for row in rows if row.mig_id is not None],
                "now": now,
                "end": end,
                "last": snap.last_allocation_id,
                "project": pending.project_id,
                "done": sorted(done),
                "booking": pending.pk,
                "active": State.ACTIVE,
                "sources": list(transition_sources(State.ACTIVE)),
                "duration": pending.duration_s,
                "gpus": [row.gpu_id for row in rows],
                "mig_or_null": [row.mig_id for row in rows],
                "fractions": [row.fraction for row in rows],
                "shares": [row.share for row in rows],
                "memory": [row.memory_mib for row in rows],
            },
        )
        return cursor.rowcount == len(rows)


def _start_portable(pending, rows, snap, now, end, done) -> bool:
    # The same steps through the ORM, for the embedded SQLite site.
    lock_quota_subjects(project_id=pending.project_id)
    lock_nodes({row.node_id for row in rows})
    if not _still_valid(pending, rows, snap, now, end, done) or not _shares_fit(rows, now, end):
        return False
    if not _resources_fit(pending, rows, snap, now, end):
        return False
    if not booking_cas(
        pending.pk,
        to=State.ACTIVE,
        where={"duration_s": pending.duration_s},
        started_at=now,
        planned_start=now,
        queue_position=None,
        pending_reason="",
        state_detail="",
    ):
        return False
    Allocation.objects.bulk_create(
        Allocation(
            booking_id=pending.pk,
            gpu_id=row.gpu_id,
            mig_instance_id=row.mig_id,
            start=now,
            end=end,
            fraction=row.fraction,
            share=row.share,
            gpu_memory_mib=row.memory_mib,
        )
        for row in rows
    )
    return True


def _shares_fit(rows: list[DeviceRow], now: datetime, end: datetime) -> bool:
    """The fractions among the rows still fit on their shared GPUs (under the node locks)."""
    return all(
        share_fits(
            gpu_id=row.gpu_id, share=row.share, memory_mib=row.memory_mib, start=now, end=end
        )
        for row in rows
        if row.memory_mib is not None
    )


def _resources_fit(pending, rows, snap, now, end) -> bool:
    """The cores and memory it takes on its nodes still fit beside the others' (node locks)."""
    return resources_fit(
        booking_id=pending.pk,
        asked=(pending.cpus, pending.memory_mib),
        devices=[(row.node_id, row.fraction) for row in rows],
        during=(now, end),
        policy=snap.policy,
    )


def _still_valid(pending, rows, snap, now, end, done) -> bool:
    node_ids = {row.node_id for row in rows}
    if Node.objects.filter(pk__in=node_ids, state=Node.State.UP).count() != len(node_ids):
        return False
    whole = [row.gpu_id for row in rows if row.mig_id is None and row.memory_mib is None]
    migs = [row.mig_id for row in rows if row.mig_id is not None]
    exclusive = inventory.gpus_bookable().filter(sharing=Gpu.Sharing.EXCLUSIVE)
    if exclusive.filter(pk__in=whole).count() != len(whole):
        return False
    if inventory.mig_instances_bookable().filter(pk__in=migs).count() != len(migs):
        return False
    mig_gpus = [row.gpu_id for row in rows if row.mig_id is not None]
    taken = Allocation.objects.filter(live=True, start__lt=end, end__gt=now).filter(
        Q(gpu_id__in=whole)
        | Q(mig_instance_id__in=migs)
        | Q(gpu_id__in=mig_gpus, mig_instance=None)
    )
    if taken.exists():
        return False
    newer = Allocation.objects.filter(
        pk__gt=snap.last_allocation_id, booking__project_id=pending.project_id
    ).exclude(booking_id__in=done)
    return not newer.exists()
