"""Plot figures for the pages: plain functions, data in, plotly figure dict out. No ORM here.

The browser draws the dicts with the plotly.js the portal serves itself; static/portal/charts.js
applies the light or dark colours, so figures carry no colours of their own except series hues.
"""

from datetime import date, datetime, timedelta

from portal.services.core.clock import to_epoch

# (sample key, chart title, y-axis title, fixed y range or None)
METRICS = [
    ("utilization_gpu", "Utilization", "%", [0, 100]),
    ("memory_used_mib", "Memory used", "GiB", None),
    ("temperature_c", "Temperature", "°C", None),
    ("power_w", "Power", "W", None),
]
NOT_MEASURED = "Utilization is not measured on MIG instances (NVIDIA reports none per slice)."
WHOLE_GPU_ONLY = "Reported for the whole GPU only: see the GPU's own page."
NO_VALUES = "No readings of this in the range."


# Time axis labels by zoom level (plotly picks the stop by tick spacing, in ms): seconds within
# a minute, hours within a day, weekday and date beyond; the hover always shows the full time.
TIME_TICKS = [
    {"dtickrange": [None, 60_000], "value": "%H:%M:%S"},
    {"dtickrange": [60_000, 86_400_000], "value": "%H:%M"},
    {"dtickrange": [86_400_000, None], "value": "%a %-d %b"},
]
MIN_GAP_S = 30.0


def _layout(y_title: str, y_range=None) -> dict:
    yaxis = {"title": {"text": y_title}, "rangemode": "tozero", "fixedrange": True}
    if y_range:
        yaxis["range"] = y_range
    return {
        "margin": {"l": 48, "r": 12, "t": 8, "b": 36},
        "height": 220,
        "showlegend": False,
        "xaxis": {
            "type": "date",
            "tickformatstops": TIME_TICKS,
            "hoverformat": "%Y-%m-%d %H:%M:%S UTC",
        },
        "yaxis": yaxis,
        "hovermode": "x unified",
    }


def with_gaps(samples: list[dict], *, min_gap_s: float = MIN_GAP_S) -> list[dict]:
    """The samples with an empty point wherever readings stopped for a while, so the line
    breaks there instead of drawing straight across the missing stretch.

    "A while" is three times the usual spacing of these samples (the median), at least
    `min_gap_s`: raw readings every few seconds and minute averages each get their own.
    """
    if len(samples) < 2:
        return list(samples)
    times = [_seconds(s["time"]) for s in samples]
    steps = sorted(b - a for a, b in zip(times, times[1:], strict=False))
    limit = max(min_gap_s, 3 * steps[len(steps) // 2])
    out = [samples[0]]
    for previous, sample, t0, t1 in zip(samples, samples[1:], times, times[1:], strict=False):
        if t1 - t0 > limit:
            out.append({"time": _midpoint(previous["time"], sample["time"])})
        out.append(sample)
    return out


def _seconds(value) -> float:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return to_epoch(value)


def _midpoint(a, b):
    if isinstance(a, str):
        a, b = datetime.fromisoformat(a), datetime.fromisoformat(b)
    return a + (b - a) / 2


def booking_marks(marks: list[tuple[datetime, datetime, str]]) -> dict:
    """Layout shapes and labels that shade each (start, end, label) booking on a time chart."""
    shapes, notes = [], []
    for start, end, label in marks:
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": start,
                "x1": end,
                "y0": 0,
                "y1": 1,
                "layer": "below",
                "line": {"width": 0},
                "fillcolor": "rgba(64, 112, 224, 0.10)",
            }
        )
        notes.append(
            {
                "xref": "x",
                "yref": "paper",
                "x": start,
                "y": 1,
                "xanchor": "left",
                "yanchor": "top",
                "text": label,
                "showarrow": False,
                "font": {"size": 10},
            }
        )
    return {"shapes": shapes, "annotations": notes}


def _value(sample: dict, key: str):
    value = sample.get(key)
    if value is not None and key == "memory_used_mib":
        return round(value / 1024, 2)
    return value


def metric_figure(
    series: dict[str, list[dict]], *, key: str, y_title: str, y_range=None, marks=None
) -> dict:
    """One metric over time, one line per device; gaps (None, or readings that stopped) stay
    gaps, never zeros or straight lines; `marks` shade bookings."""
    layout = _layout(y_title, y_range)
    layout["showlegend"] = len(series) > 1
    if marks:
        layout.update(booking_marks(marks))
    gapped = {label: with_gaps(samples) for label, samples in series.items()}
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines",
                "x": [s["time"] for s in samples],
                "y": [_value(s, key) for s in samples],
                "connectgaps": False,
                "line": {"width": 1.5},
                "name": label,
            }
            for label, samples in gapped.items()
        ],
        "layout": layout,
    }


def device_charts(series: dict[str, list[dict]], *, is_mig: bool, marks=None) -> list[dict]:
    """The four charts of one or more devices: {"key", "title", "figure" or None, "note"} each."""
    charts = []
    has_samples = any(series.values())
    for key, title, y_title, y_range in METRICS:
        measured = any(s.get(key) is not None for samples in series.values() for s in samples)
        if key == "utilization_gpu" and is_mig and not measured:
            charts.append({"key": key, "title": title, "figure": None, "note": NOT_MEASURED})
        elif not has_samples:
            charts.append({"key": key, "title": title, "figure": None, "note": "No history yet."})
        elif not measured:
            note = WHOLE_GPU_ONLY if is_mig else NO_VALUES
            charts.append({"key": key, "title": title, "figure": None, "note": note})
        else:
            figure = metric_figure(series, key=key, y_title=y_title, y_range=y_range, marks=marks)
            charts.append({"key": key, "title": title, "figure": figure, "note": ""})
    return charts


def mean_utilization(samples: list[dict]) -> float | None:
    """Mean GPU utilization over the samples that measured it; None when none did."""
    values = [s["utilization_gpu"] for s in samples if s.get("utilization_gpu") is not None]
    return round(sum(values) / len(values), 1) if values else None


def daily_gpu_hours(
    rows, *, first_day: date, days: int
) -> tuple[list[date], dict[str, list[float]]]:
    """GPU-hours per user per UTC day from (user, start, end, fraction) rows, for `days` days."""
    dates = [first_day + timedelta(days=i) for i in range(days)]
    series: dict[str, list[float]] = {}
    for user, start, end, fraction in rows:
        hours = series.setdefault(user, [0.0] * days)
        for i, day in enumerate(dates):
            day_start = datetime(day.year, day.month, day.day, tzinfo=start.tzinfo)
            day_end = day_start + timedelta(days=1)
            overlap = (min(end, day_end) - max(start, day_start)).total_seconds()
            if overlap > 0:
                hours[i] += fraction * overlap / 3600
    return dates, {u: [round(h, 2) for h in hs] for u, hs in sorted(series.items())}


def member_hours_figure(dates: list[date], series: dict[str, list[float]]) -> dict:
    """Stacked daily bars of GPU-hours, one colour per member."""
    return {
        "data": [
            {
                "type": "bar",
                "name": user,
                "x": [d.isoformat() for d in dates],
                "y": hours,
                "hovertemplate": "%{y:.1f} GPU-h<extra>" + user + "</extra>",
            }
            for user, hours in series.items()
        ],
        "layout": {
            "barmode": "stack",
            "height": 280,
            "margin": {"l": 48, "r": 12, "t": 8, "b": 36},
            "xaxis": {"type": "date"},
            "yaxis": {"title": {"text": "GPU-hours"}, "rangemode": "tozero", "fixedrange": True},
            "legend": {"orientation": "h", "y": -0.2},
        },
    }


def accounting_figures(rows: list[dict], group_by: str) -> list[dict]:
    """Bars of GPU-hours and of energy per group, largest first (at most 30 groups)."""
    top = rows[:30]
    names = [str(row[group_by]) for row in top]
    charts = []
    for key, title, unit in (("gpu_hours", "GPU-hours", "GPU-h"), ("energy_kwh", "Energy", "kWh")):
        figure = {
            "data": [
                {
                    "type": "bar",
                    "x": names,
                    "y": [row[key] for row in top],
                    "hovertemplate": "%{x}: %{y:.2f} " + unit + "<extra></extra>",
                }
            ],
            "layout": {
                "height": 260,
                "margin": {"l": 56, "r": 12, "t": 8, "b": 64},
                "showlegend": False,
                "xaxis": {"type": "category", "automargin": True},
                "yaxis": {"title": {"text": unit}, "rangemode": "tozero", "fixedrange": True},
            },
        }
        charts.append({"key": f"acct-{key}", "title": f"{title} per {group_by}", "figure": figure})
    return charts
