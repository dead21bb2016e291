"""The sweep's frontier: which policies dominate the default on a row, and their ratios to EASY.

A policy *dominates* another on a row when it is no worse on mean, p99 and max wait and on
utilization, and strictly better on at least one of them (docs/scheduling.md, "The frontier").

When no policy escapes domination everywhere, the issue's fallback is the policy *closest to the
target* (mean <= 0.5 x EASY, p99 and max <= 1 x): ``target_shortfall`` measures one row, and
``closest`` ranks the policies that keep a no-starvation bound (``starvation_bound``).
"""

from __future__ import annotations

import math

from scheduler.types import Policy

# (metric, sense): lower waits and higher utilization are better.
CRITERIA = (
    ("mean_wait_s", -1),
    ("p99_wait_s", -1),
    ("max_wait_s", -1),
    ("utilization", 1),
)
# Relative slack under which two figures count as equal (float noise, not a real difference).
_EQUAL = 1e-9


def _compare(a: float, b: float, sense: int) -> int:
    """1 when a is better than b in ``sense``, -1 when worse, 0 when equal."""
    if abs(a - b) <= _EQUAL * max(abs(a), abs(b), 1.0):
        return 0
    return 1 if (a - b) * sense > 0 else -1


def dominates(a: dict, b: dict) -> bool:
    """Replay metrics ``a`` dominate ``b``: no worse on every criterion, better on one."""
    verdicts = [_compare(a[name], b[name], sense) for name, sense in CRITERIA]
    return min(verdicts) >= 0 and max(verdicts) > 0


def policy_labels(row: dict) -> list[str]:
    """The policies replayed on a sweep row (its keys that hold a metrics dict), in order."""
    return [label for label, value in row.items() if isinstance(value, dict)]


def dominators(row: dict, default: str = "portal") -> list[str]:
    """Every other policy of the row that dominates ``default`` on it."""
    mine = row[default]
    return [
        label for label in policy_labels(row) if label != default and dominates(row[label], mine)
    ]


def ratio_cell(result: dict, easy: dict) -> str:
    """mean / p99 / max wait and utilization as multiples of EASY's, in one cell."""
    parts = []
    for name, _ in CRITERIA:
        mine, base = result[name], easy[name]
        if base == 0:
            parts.append("0" if mine == 0 else "inf")
        else:
            parts.append(f"{mine / base:.3f}" if name == "utilization" else f"{mine / base:.2f}")
    return " / ".join(parts)


def frontier_table(rows: list[dict], default: str = "portal") -> str:
    """One column per policy other than the default and EASY: its ratios to EASY per row."""
    names = [label for label in policy_labels(rows[0]) if label not in (default, "easy")]
    head = "| trace | GPUs | load | walltime | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 4)]
    for row in rows:
        cells = [row["trace"], str(row["gpus"]), f"{row['load']:.0%}", row["model"]]
        cells += [ratio_cell(row[name], row["easy"]) if name in row else "" for name in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shown_error_cells(row: dict, default: str = "portal") -> list[str]:
    """p50 and p90 error (hours) of the planned start shown at submission, default / EASY."""
    mine, easy = row[default], row["easy"]
    if "planned_start_error_p50_s" not in mine or "planned_start_error_p50_s" not in easy:
        return ["", ""]
    return [
        f"{mine[key] / 3600:.1f} / {easy[key] / 3600:.1f}"
        for key in ("planned_start_error_p50_s", "planned_start_error_p90_s")
    ]


def shown_no_worse(row: dict, default: str = "portal") -> bool | None:
    """The default's shown-start error is no worse than EASY's at p50 and p90 (None: not
    measured)."""
    mine, easy = row[default], row["easy"]
    keys = ("planned_start_error_p50_s", "planned_start_error_p90_s")
    if any(key not in mine or key not in easy for key in keys):
        return None
    return all(mine[key] <= easy[key] + 1e-9 for key in keys)


# The sweep's targets per row, as multiples of EASY's: (ratio, bound, sense).
TARGETS = (("mean", 0.5, "<="), ("p99", 1.0, "<="), ("max", 1.0, "<="), ("util", 1.0, ">="))


def ratios(result: dict, easy: dict) -> dict[str, float]:
    """mean, p99, max wait and utilization as multiples of EASY's."""

    def over(a: float, b: float) -> float:
        if b == 0:
            return 0.0 if a == 0 else math.inf  # nobody waited under either: met
        return a / b

    return {
        "mean": over(result["mean_wait_s"], easy["mean_wait_s"]),
        "p99": over(result["p99_wait_s"], easy["p99_wait_s"]),
        "max": over(result["max_wait_s"], easy["max_wait_s"]),
        "util": over(result["utilization"], easy["utilization"]),
    }


def starvation_bound(policy: Policy) -> str | None:
    """The wait bound ``policy`` keeps (docs/scheduling.md, "The no-starvation bound"), or None.

    "(k+1)W": the oldest pending booking holds a reservation nothing later can delay (it is
    protected, or the walk is in arrival order, so the oldest that cannot start is the head).
    "threshold+(k+1)W": only a booking pending past a threshold is protected. None: an order by
    size or response ratio can pass the oldest booking over for as long as smaller work arrives.
    """
    if policy.protect_oldest >= 1 or policy.order == "arrival":
        return "(k+1)W"
    if policy.protect_after_runs is not None:
        return "threshold+(k+1)W"
    return None


def target_shortfall(result: dict, easy: dict) -> float | None:
    """How far one row's result is from the target: the sum of its mean ratio over 0.5 and its
    p99 and max ratios over 1 (EASY = 1), 0 when it meets all three. None where nobody waits
    under EASY (no ratio to take)."""
    if any(easy[name] == 0 for name in ("mean_wait_s", "p99_wait_s", "max_wait_s")):
        return None
    mine = ratios(result, easy)
    return sum(max(0.0, mine[name] - bound) for name, bound, sense in TARGETS if sense == "<=")


def closest(rows: list[dict], bounds: dict[str, str | None]) -> list[tuple[str, float, float]]:
    """(policy, mean shortfall over the rows where anyone waits, worst row's shortfall) for
    each policy of ``bounds`` that keeps a bound, closest to the target first (ties: the worse
    worst row last, then name). Utilization is not in the shortfall (the issue's target names
    the waits alone); the sweep's dominance column still weighs it."""
    out = []
    for name, bound in bounds.items():
        if bound is None:
            continue
        gaps = [
            target_shortfall(row[name], row["easy"]) if name in row else math.inf for row in rows
        ]
        gaps = [gap for gap in gaps if gap is not None]
        if gaps:
            out.append((name, sum(gaps) / len(gaps), max(gaps)))
    return sorted(out, key=lambda item: (item[1], item[2], item[0]))
