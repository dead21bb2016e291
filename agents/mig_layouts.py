"""MIG layout changes on the node: apply each one the portal asks for (DesiredState.mig_layouts)
once, when no active booking holds its GPU, and keep the results for the next register."""

from __future__ import annotations

import logging
from datetime import datetime

from agents.backend import Backend, MigLayoutError
from agents.dispatch import active_bookings
from agents.protocol import DesiredState, MigChangeResult

log = logging.getLogger(__name__)


class MigLayouts:
    """The changes tried (by change id) and their results not yet registered."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.tried: set[int] = set()
        self.results: list[MigChangeResult] = []

    def apply(self, desired: DesiredState, children: dict[str, list[str]], now: datetime) -> bool:
        """Try every change not tried yet whose GPU (``children``: its MIG instances' UUIDs)
        no active booking of ``desired`` holds; True when one was tried (the caller reads the
        inventory again and registers)."""
        tried = False
        for layout in desired.mig_layouts:
            devices = {layout.gpu_uuid, *children.get(layout.gpu_uuid, [])}
            held = any(
                devices.intersection(b.device_uuids) for b in active_bookings(desired.bookings, now)
            )
            if layout.change_id in self.tried or held:
                continue
            self.tried.add(layout.change_id)
            tried = True
            try:
                self.backend.apply_mig_layout(layout.gpu_uuid, layout.instances)
            except MigLayoutError as exc:
                log.error("MIG layout change %d failed: %s", layout.change_id, exc)
                self.results.append(MigChangeResult(layout.change_id, False, str(exc)[:300]))
            else:
                log.info("MIG layout change %d applied on %s", layout.change_id, layout.gpu_uuid)
                self.results.append(MigChangeResult(layout.change_id, True))
        return tried
