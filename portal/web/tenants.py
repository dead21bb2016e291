"""The tenants of a shared GPU as its pages show them: each booking's share, memory share and the
GPU memory its processes use in the latest reading (the agent names each process's booking,
agents/memshare.py)."""

from __future__ import annotations

from dataclasses import dataclass

from portal.models import Allocation, Booking


@dataclass(frozen=True)
class TenantLine:
    """One booking on a shared GPU now."""

    booking: Booking
    share: float
    memory_mib: int | None  # its memory share
    used_mib: int | None  # its processes' GPU memory in the latest reading (None: unknown)

    @property
    def percent(self) -> str:
        return f"{self.share * 100:.0f} %"

    @property
    def over(self) -> bool:
        return None not in (self.used_mib, self.memory_mib) and self.used_mib > self.memory_mib


def tenant_lines(allocations: list[Allocation], reading: dict | None) -> list[TenantLine]:
    """The tenants of one GPU from its live fractional allocations (booking selected), largest
    share first, with what the latest reading says each one uses."""
    used: dict[int, int] = {}
    for process in (reading or {}).get("processes") or ():
        booking_id, memory = process.get("booking_id"), process.get("used_memory_mib")
        if booking_id is not None and memory is not None:
            used[booking_id] = used.get(booking_id, 0) + memory
    lines = [
        TenantLine(
            a.booking,
            a.share,
            a.gpu_memory_mib,
            used.get(a.booking_id, 0 if reading else None),
        )
        for a in allocations
    ]
    return sorted(lines, key=lambda t: (-t.share, t.booking.pk))
