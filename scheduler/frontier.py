"""The sweep's frontier: which policies dominate the default on a row, and their ratios to EASY.

A policy *dominates* another on a row when it is no worse on mean, p99 and max wait and on
utilization, and strictly better on at least one of them (docs/scheduling.md, "The frontier").
"""

from __future__ import annotations

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
