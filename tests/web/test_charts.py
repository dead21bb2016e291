"""Plot figures and usage maths: plain functions, no database."""

from datetime import UTC, date, datetime, timedelta

from portal.web import calendar, charts, history, selectors

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def _sample(minute, **values):
    return {"time": (T0 + timedelta(minutes=minute)).isoformat(), **values}


def test_it_never_draws_zeros_for_unmeasured_mig_utilization():
    samples = [_sample(i, utilization_gpu=None, memory_used_mib=2048) for i in range(3)]
    figures = {c["key"]: c for c in charts.device_charts({"mig": samples}, is_mig=True)}
    assert figures["utilization_gpu"]["figure"] is None
    assert "not measured" in figures["utilization_gpu"]["note"]
    assert figures["memory_used_mib"]["figure"]["data"][0]["y"] == [2.0, 2.0, 2.0]
    assert figures["power_w"]["figure"] is None  # no empty axes for what a slice never reports
    assert "whole GPU" in figures["power_w"]["note"]


def test_it_keeps_gaps_as_gaps():
    samples = [_sample(0, utilization_gpu=50.0), _sample(1, utilization_gpu=None)]
    figure = charts.metric_figure({"gpu0": samples}, key="utilization_gpu", y_title="%")
    assert figure["data"][0]["y"] == [50.0, None]
    assert figure["layout"]["yaxis"]["title"]["text"] == "%"


def test_it_breaks_the_line_where_readings_stopped_instead_of_drawing_across():
    def at(seconds, value):
        return {"time": (T0 + timedelta(seconds=seconds)).isoformat(), "power_w": value}

    # Every 5 s for a minute, then the node was silent for 10 minutes, then every 5 s again.
    samples = [at(5 * i, 200.0) for i in range(13)] + [at(660 + 5 * i, 300.0) for i in range(3)]
    figure = charts.metric_figure({"gpu0": samples}, key="power_w", y_title="W")
    y = figure["data"][0]["y"]
    assert len(y) == len(samples) + 1 and y[13] is None  # one break, at the silence
    assert y[12] == 200.0 and y[14] == 300.0
    assert figure["data"][0]["connectgaps"] is False
    # Minute averages a minute apart are not gaps; a missing hour of them is.
    minutes = [_sample(m, power_w=1.0) for m in (*range(10), *range(70, 75))]
    assert [p.get("power_w") for p in charts.with_gaps(minutes)].count(None) == 1


def test_it_shades_bookings_on_a_devices_charts_and_labels_times_readably():
    marks = [(T0, T0 + timedelta(minutes=30), "#7 alice")]
    samples = [_sample(m, utilization_gpu=10.0) for m in range(40)]
    figure = charts.device_charts({"gpu0": samples}, is_mig=False, marks=marks)[0]["figure"]
    [shape] = figure["layout"]["shapes"]
    assert (shape["x0"], shape["x1"], shape["yref"]) == (T0, T0 + timedelta(minutes=30), "paper")
    assert figure["layout"]["annotations"][0]["text"] == "#7 alice"
    xaxis = figure["layout"]["xaxis"]
    assert xaxis["hoverformat"].endswith("UTC") and xaxis["tickformatstops"]


def test_it_takes_a_custom_history_range_and_refuses_a_bad_one():
    now = T0 + timedelta(days=2)
    name, since, until, error = history.range_window(
        "custom", now, "2026-11-30T08:00", "2026-11-30T12:30"
    )
    assert (name, error) == ("custom", "")
    assert (since, until) == (T0 - timedelta(hours=2), T0 + timedelta(hours=2, minutes=30))
    for start, end, reason in (
        ("yesterday", "", "dates and times"),
        ("2026-11-30T12:00", "2026-11-30T08:00", "before the end"),
        ("2026-10-01T00:00", "2026-11-30T00:00", "at most 31 days"),
    ):
        name, since, until, error = history.range_window("custom", now, start, end)
        assert name == "hour" and reason in error and until - since == timedelta(hours=1)


def test_it_says_no_history_yet_without_samples():
    assert {c["note"] for c in charts.device_charts({"gpu0": []}, is_mig=False)} == {
        "No history yet."
    }


def test_it_computes_efficiency_over_measured_samples_only():
    samples = [_sample(0, utilization_gpu=20.0), _sample(1, utilization_gpu=None)]
    samples.append(_sample(2, utilization_gpu=60.0))
    assert charts.mean_utilization(samples) == 40.0
    assert charts.mean_utilization([_sample(0, utilization_gpu=None)]) is None


def test_it_splits_gpu_hours_per_member_and_day():
    rows = [
        ("alice", T0.replace(hour=22), T0.replace(hour=22) + timedelta(hours=4), 1.0),
        ("bob", T0, T0 + timedelta(hours=1), 3 / 7),
    ]
    dates, series = charts.daily_gpu_hours(rows, first_day=date(2026, 11, 30), days=2)
    assert dates == [date(2026, 11, 30), date(2026, 12, 1)]
    assert series == {"alice": [2.0, 2.0], "bob": [0.43, 0.0]}


def test_it_places_bars_inside_the_week_only():
    since = T0
    until = T0 + timedelta(days=7)
    assert calendar.geometry(T0 - timedelta(days=1), T0 + timedelta(hours=42), since, until) == (
        0.0,
        25.0,
    )
    assert calendar.geometry(until, until + timedelta(hours=1), since, until) is None


def test_it_starts_weeks_on_monday():
    assert calendar.week_start("2026-12-03", date(2026, 1, 1)) == date(2026, 11, 30)
    assert calendar.week_start("junk", date(2026, 12, 6)) == date(2026, 11, 30)


def test_it_computes_the_booked_share_of_capacity():
    rows = [(T0, T0 + timedelta(hours=2), 1.0), (T0, T0 + timedelta(hours=8), 0.5)]
    share = selectors.booked_share(rows, since=T0, until=T0 + timedelta(hours=4), capacity=2)
    assert share == 50.0


def test_it_calls_a_device_in_use_only_when_work_runs_on_it():
    booking = object()
    busy = {"utilization_gpu": 80.0, "processes": []}
    idle = {"utilization_gpu": 0.0, "processes": []}
    assert selectors.device_state(node_state="up", booking=None, reading=busy) == "free"
    assert selectors.device_state(node_state="up", booking=booking, reading=busy, busy=True) == (
        "in_use"
    )
    assert selectors.device_state(node_state="up", booking=booking, reading=idle) == "booked"
    assert selectors.device_state(node_state="down", booking=None, reading=None) == "down"


def test_it_calls_a_device_with_processes_but_no_booking_in_use_unbooked_not_free():
    someone = {"utilization_gpu": 0.0, "processes": [{"pid": 77, "user": "eve"}]}
    assert selectors.device_state(node_state="up", booking=None, reading=someone) == "unbooked"
    row = selectors.DeviceRow("u", "n/gpu0", "n", "up", 1, "A100", "MIG", 1, False, reading=None)
    row.children = [
        selectors.DeviceRow("m", "n/gpu0/1g", "n", "up", 1, "A100", "1g", 1, True, state=s)
        for s in ("free", "unbooked")
    ]
    assert selectors._parent_state(row) == "unbooked"
    assert row.state_label == "free" and row.children[1].state_label == "in use, unbooked"
