"""Pure GPU allocator: frozen dataclasses in, a plan out (see docs/scheduling.md)."""

from scheduler.admission import Refusal, admission_refusal, never_fits
from scheduler.allocator import plan
from scheduler.borrowing import borrow_backoff
from scheduler.kept_walk import KeptWalk, keep_walk
from scheduler.priority import carry_usage, charged_fraction, decay_usage, predict_run
from scheduler.quota import (
    QuotaRefusal,
    QuotaSide,
    budget_nearly_used,
    position_refusal,
    quota_refusal,
)
from scheduler.resources import billing_equivalents, node_demand, total_demand
from scheduler.types import (
    REASONS,
    Allocation,
    Device,
    NodeResources,
    Plan,
    Planned,
    Policy,
    Preemption,
    Priority,
    Quota,
    Request,
    Start,
    State,
)

__all__ = [
    "REASONS",
    "Allocation",
    "Device",
    "KeptWalk",
    "NodeResources",
    "Plan",
    "Planned",
    "Policy",
    "Preemption",
    "Priority",
    "Quota",
    "QuotaRefusal",
    "QuotaSide",
    "Refusal",
    "Request",
    "Start",
    "State",
    "admission_refusal",
    "borrow_backoff",
    "budget_nearly_used",
    "carry_usage",
    "charged_fraction",
    "decay_usage",
    "keep_walk",
    "never_fits",
    "node_demand",
    "total_demand",
    "billing_equivalents",
    "plan",
    "position_refusal",
    "predict_run",
    "quota_refusal",
]
