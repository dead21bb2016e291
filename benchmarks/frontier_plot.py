"""The frontier per trace as an SVG plot: mean against max wait, one point per policy.

    python -m scheduler.replay --sweep --json rows.json
    python benchmarks/frontier_plot.py rows.json --out docs/img

Each point is a policy's geometric mean, over the trace's rows (sizes x walltime models), of its
mean and max wait as multiples of EASY's; rows where nobody waits under EASY are left out. The
dashed lines are EASY (1, 1); the shaded corner is the target (mean <= 0.5 x, max <= 1 x).
FIFO is left out (1.1-50 x EASY on mean: off the scale). Points are numbered, the legend names
them with their coordinates.
Written by hand (no plotting library): one file per trace, frontier-<trace>.svg.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

WIDTH, HEIGHT, MARGIN, LEGEND = 760, 380, 56, 220
DEFAULT = "portal"
# FIFO waits 1.1-50 x EASY on mean: off the scale of the others, so left out of the plot.
LEFT_OUT = ("fifo",)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-3)) for v in values) / len(values))


def frontier_points(rows: list[dict], trace: str) -> dict[str, tuple[float, float]]:
    """policy -> (mean wait, max wait) as geometric-mean multiples of EASY's over the rows of
    ``trace`` where EASY's mean and max wait are not zero."""
    kept = [
        row
        for row in rows
        if row["trace"] == trace
        and row["easy"]["mean_wait_s"] > 0
        and row["easy"]["max_wait_s"] > 0
    ]
    names = [key for key, value in kept[0].items() if isinstance(value, dict)] if kept else []
    names = [name for name in names if name not in LEFT_OUT]
    points = {}
    for name in names:
        means = [row[name]["mean_wait_s"] / row["easy"]["mean_wait_s"] for row in kept]
        maxes = [row[name]["max_wait_s"] / row["easy"]["max_wait_s"] for row in kept]
        points[name] = (_geomean(means), _geomean(maxes))
    return points


def _scale(low: float, high: float, size: float, flip: bool):
    def to_px(value: float) -> float:
        share = (value - low) / (high - low)
        return MARGIN + (1 - share if flip else share) * size

    return to_px


def svg(points: dict[str, tuple[float, float]], title: str) -> str:
    """An SVG scatter of ``points`` (x: mean wait / EASY, y: max wait / EASY)."""
    xs = [x for x, _ in points.values()] + [0.0, 1.1]
    ys = [y for _, y in points.values()] + [0.0, 1.1]
    x_hi, y_hi = max(xs) * 1.08, max(ys) * 1.08
    plot_w, plot_h = WIDTH - 2 * MARGIN - LEGEND, HEIGHT - 2 * MARGIN
    px, py = _scale(0.0, x_hi, plot_w, False), _scale(0.0, y_hi, plot_h, True)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{(WIDTH - LEGEND) / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
        f'<rect x="{px(0):.1f}" y="{py(1.0):.1f}" width="{px(0.5) - px(0):.1f}" '
        f'height="{py(0) - py(1.0):.1f}" fill="#e6f4e6"/>',
        f'<line x1="{px(1):.1f}" y1="{py(0):.1f}" x2="{px(1):.1f}" y2="{py(y_hi):.1f}" '
        'stroke="#999" stroke-dasharray="4 3"/>',
        f'<line x1="{px(0):.1f}" y1="{py(1):.1f}" x2="{px(x_hi):.1f}" y2="{py(1):.1f}" '
        'stroke="#999" stroke-dasharray="4 3"/>',
        f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(x_hi):.1f}" y2="{py(0):.1f}" '
        'stroke="black"/>',
        f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(0):.1f}" y2="{py(y_hi):.1f}" '
        'stroke="black"/>',
        f'<text x="{(WIDTH - LEGEND) / 2}" y="{HEIGHT - 12}" text-anchor="middle">'
        "mean wait / EASY (geometric mean over the rows)</text>",
        f'<text x="16" y="{HEIGHT / 2}" text-anchor="middle" '
        f'transform="rotate(-90 16 {HEIGHT / 2})">max wait / EASY</text>',
    ]
    out += _ticks(px, py, x_hi, y_hi)
    legend_x = WIDTH - LEGEND + 8
    for number, (name, (x, y)) in enumerate(sorted(points.items()), 1):
        colour = "#c0392b" if name == DEFAULT else "#2c3e50"
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{px(x) + 5:.1f}" y="{py(y) - 4:.1f}" fill="{colour}">{number}</text>')
        out.append(
            f'<text x="{legend_x}" y="{MARGIN + 16 * number}" fill="{colour}">'
            f"{number} {name} ({x:.2f}, {y:.2f})</text>"
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _ticks(px, py, x_hi: float, y_hi: float) -> list[str]:
    out = []
    for step in range(int(x_hi / 0.25) + 1):
        value = step * 0.25
        out.append(
            f'<text x="{px(value):.1f}" y="{py(0) + 14:.1f}" text-anchor="middle">{value:g}</text>'
        )
    for step in range(int(y_hi / 0.25) + 1):
        value = step * 0.25
        out.append(
            f'<text x="{px(0) - 6:.1f}" y="{py(value) + 4:.1f}" text-anchor="end">{value:g}</text>'
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Write frontier-<trace>.svg for every trace in the sweep's rows."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/img"))
    args = parser.parse_args(argv)
    rows = json.loads(args.rows.read_text())
    for trace in dict.fromkeys(row["trace"] for row in rows):
        points = frontier_points(rows, trace)
        if points:
            path = args.out / f"frontier-{trace}.svg"
            path.write_text(svg(points, f"{trace}: the frontier (whole trace, every row)"))
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
