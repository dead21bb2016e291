"""Literal builders for allocator tests (no Django, no database)."""

from __future__ import annotations

from scheduler import Allocation, Device, Policy, Request, State

MIG_1G = "1g.10gb"
MIG_3G = "3g.40gb"


def gpus(node: str, count: int = 8, model: str = "A100", state: str = "up", temps=None):
    """``count`` whole GPUs on ``node`` named ``<node>-g<i>``."""
    temps = temps or [None] * count
    return tuple(
        Device(f"{node}-g{i}", node, model, node_state=state, temperature_c=temps[i])
        for i in range(count)
    )


def mig(node: str, layout: dict[int, list[str]], model: str = "A100"):
    """MIG instances: ``layout[gpu] = [profile, ...]`` on ``node``."""
    out = []
    for gpu, profiles in layout.items():
        for k, profile in enumerate(profiles):
            slices = int(profile[0])
            out.append(
                Device(
                    f"{node}-g{gpu}-{k}", node, model, profile, slices / 7, parent=f"{node}-g{gpu}"
                )
            )
    return tuple(out)


def req(bid: str, gpus: int = 1, duration: float = 100.0, submit: float = 0.0, **kw) -> Request:
    """A pending booking of user u / project p unless told otherwise."""
    kw.setdefault("user", "u")
    kw.setdefault("project", "p")
    return Request(bid, submit_time=submit, duration_s=duration, gpus=gpus, **kw)


def alloc(bid: str, devices, end: float, start: float = 0.0, **kw) -> Allocation:
    """A running allocation (pass running=False for an advance reservation)."""
    kw.setdefault("user", "other")
    kw.setdefault("project", "other")
    return Allocation(bid, tuple(devices), start, end, **kw)


def state(devices, pending=(), allocations=(), now: float = 0.0, **kw) -> State:
    """A State at ``now``."""
    return State(
        now=now,
        devices=tuple(devices),
        allocations=tuple(allocations),
        pending=tuple(pending),
        **kw,
    )


# The walk of the issue-9 default: the multifactor priority, a reservation for every booking.
MULTIFACTOR = dict(order="priority", backfill="conservative")
FIFO_ORDER = Policy(
    order="arrival",
    backfill="conservative",
    weight_age=0.0,
    weight_fairshare=0.0,
    weight_size=0.0,
    weight_qos=0.0,
    protect_after_runs=None,
    protect_oldest=0,
)


def by_id(plan) -> dict:
    """Planned lines keyed by booking id."""
    return {line.booking_id: line for line in plan.planned}


def shared(node: str, count: int = 2, memory_mib: int = 81920, model: str = "A100"):
    """``count`` shared GPUs (fractions only) on ``node`` named ``<node>-s<i>``."""
    return tuple(
        Device(f"{node}-s{i}", node, model, shared=True, memory_mib=memory_mib)
        for i in range(count)
    )
