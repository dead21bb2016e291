"""The node's side of a MIG layout change: what its agent is told to apply (desired state), and
what its register says came of it (portal.services.inventory.mig_layouts keeps the states)."""

from datetime import datetime

from agents.protocol import DesiredMigLayout, MigChangeResult
from portal.models import MigLayoutChange, Node
from portal.services.allocation.mig_changes import mig_change_finish
from portal.services.inventory.mig_layouts import gpu_mig_layout, mig_slots


def mig_layouts_desired(*, node_id: int) -> list[DesiredMigLayout]:
    """The changes the node's agent is to apply now: the applying ones of its GPUs."""
    changes = (
        MigLayoutChange.objects.filter(state=MigLayoutChange.State.APPLYING, gpu__node_id=node_id)
        .select_related("gpu")
        .order_by("id")
    )
    return [DesiredMigLayout(c.pk, c.gpu.uuid, mig_slots(c)) for c in changes]


def mig_changes_reported(*, node: Node, results: list[MigChangeResult], now: datetime) -> None:
    """End each applying change the agent reports on, after its register has updated the
    inventory (old slices retired, new ones added): done when the GPU now has the layout asked
    for, failed with the agent's reason, or with what it has instead."""
    for result in results:
        change = (
            MigLayoutChange.objects.select_related("gpu")
            .filter(pk=result.change_id, gpu__node=node, state=MigLayoutChange.State.APPLYING)
            .first()
        )
        if change is None:
            continue  # another node's, or over already (it timed out; a register sent again)
        actual = gpu_mig_layout(gpu=change.gpu)
        if result.ok and actual == change.layout:
            mig_change_finish(change_id=change.pk, ok=True, detail="", now=now)
        elif result.ok:
            got = ", ".join(f"{i['profile']}@{i['start']}" for i in actual) or "no instances"
            detail = f"the agent reported {got}, not the layout asked for"
            mig_change_finish(change_id=change.pk, ok=False, detail=detail, now=now)
        else:
            detail = result.detail or "the agent could not apply it"
            mig_change_finish(change_id=change.pk, ok=False, detail=detail, now=now)
