"""Node alerts: one row per process an agent objected to, however often it is reported.

A process is the node, the alert's kind, the device, the booking holding it (none: 0), the pid
and the Unix user: what the agent reports of it. A repeat (an agent restarted, a node sending
the same objection again) counts on the row the first report made, with one
INSERT ... ON CONFLICT on the one_per_process constraint, so two requests racing for the same
process still make one row. Rows not reported for TELEMETRY_ROLLUP_RETENTION_D days are pruned
by the telemetry job, like the process rollups they mark.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection

from portal.models import Booking, Node, NodeAlert


@dataclass(frozen=True)
class AlertSeen:
    """The alert a report landed on, and whether the report made it (the first of its process)."""

    alert_id: int
    new: bool


def node_alert_record(
    *,
    node: Node,
    kind: str,
    time: datetime,
    now: datetime,
    booking: Booking | None,
    device_uuid: str,
    pid: int | None,
    user: str,
    action: str,
    detail: str,
) -> AlertSeen:
    """Record one report of a process: a new row, or one more count on its process's row (the
    first and last seen widened, the latest action and detail kept)."""
    table = NodeAlert._meta.db_table
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    sql = f"""
        INSERT INTO {table} (node_id, kind, time, last_seen, "count", device_uuid, pid, "user",
                             action, detail, booking_id, booking_key, owner_id, created)
        VALUES (%s, %s, %s, %s, 1, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (node_id, kind, device_uuid, booking_key, COALESCE(pid, -1), "user")
        DO UPDATE SET
            "count" = {table}."count" + 1,
            time = CASE WHEN {table}.time < EXCLUDED.time THEN {table}.time ELSE EXCLUDED.time END,
            last_seen = {greatest}({table}.last_seen, EXCLUDED.last_seen),
            action = EXCLUDED.action,
            detail = EXCLUDED.detail
        RETURNING id, "count"
    """
    moment = connection.ops.adapt_datetimefield_value
    params = [
        node.pk,
        kind,
        moment(time),
        moment(time),
        device_uuid,
        pid,
        user,
        action,
        detail,
        booking.pk if booking else None,
        booking.pk if booking else 0,
        booking.owner_id if booking else None,
        moment(now),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        alert_id, count = cursor.fetchone()
    return AlertSeen(alert_id=alert_id, new=count == 1)


def node_alerts_prune(*, now: datetime) -> int:
    """Delete the alerts no agent reported for TELEMETRY_ROLLUP_RETENTION_D days; how many."""
    before = now - timedelta(days=settings.TELEMETRY_ROLLUP_RETENTION_D)
    deleted, _ = NodeAlert.objects.filter(last_seen__lt=before).delete()
    return deleted
