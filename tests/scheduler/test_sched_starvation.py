"""Property: the no-starvation bound of docs/scheduling.md.

The oldest pending booking holds a reservation that nothing submitted after it can delay: while a
booking is the oldest pending one its planned start never moves later (run times exact, no
preemption, no new advance reservation, no node lost), so it starts within the longest walltime
of becoming the oldest, and every booking starts within (k + 1) x the longest walltime of its
submission, k the bookings older than it still pending then. The scenarios mix wide long
bookings with streams of narrow short ones, which the priority factors favour: the wide ones are
the ones that used to be overtaken pass after pass.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import Allocation, Policy, Request, State, plan
from scheduler.replay import cluster

GPUS = 16  # two nodes of 8


@st.composite
def workloads(draw):
    jobs = []
    for i in range(draw(st.integers(4, 18))):
        wide = draw(st.booleans())
        jobs.append(
            (
                f"j{i:02d}",
                float(draw(st.integers(0, 40)) * 500),
                float(draw(st.integers(20, 80)) * 500 if wide else draw(st.integers(1, 12)) * 250),
                draw(st.sampled_from((8, 12, 16))) if wide else draw(st.sampled_from((1, 2, 4))),
            )
        )
    return sorted(jobs, key=lambda job: (job[1], job[0]))


def simulate(jobs, policy):
    """Drive plan() at every submit and end; record the oldest pending booking's planned starts."""
    devices = cluster(GPUS)
    by_id = {job[0]: job for job in jobs}
    pending: dict[str, Request] = {}
    running: dict[str, Allocation] = {}
    started: dict[str, float] = {}
    older_pending: dict[str, int] = {}
    head_starts: dict[str, list[float]] = {}
    times = sorted({job[1] for job in jobs})
    while times:
        now = times.pop(0)
        for job_id in [j for j, a in running.items() if a.end <= now]:
            del running[job_id]
        for job_id, submit, duration, width in jobs:
            if submit == now:
                older_pending[job_id] = len(pending)
                pending[job_id] = Request(job_id, "u", "p", submit, duration, gpus=width)
        if not pending:
            continue
        state = State(
            now=now,
            devices=devices,
            allocations=tuple(running.values()),
            pending=tuple(pending.values()),
        )
        result = plan(state, policy)
        head = min(pending.values(), key=lambda r: (r.submit_time, r.booking_id)).booking_id
        line = next(p for p in result.planned if p.booking_id == head)
        head_starts.setdefault(head, []).append(line.start)
        for start in result.starts:
            job_id, _, duration, _ = by_id[start.booking_id]
            del pending[job_id]
            running[job_id] = Allocation(job_id, start.device_ids, now, now + duration, "u", "p")
            started[job_id] = now
            times = sorted(set(times) | {now + duration})
    return started, older_pending, head_starts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads())
def test_it_never_lets_a_later_booking_delay_the_oldest_one(jobs):
    started, older_pending, head_starts = simulate(jobs, Policy())
    for job_id, planned in head_starts.items():
        assert all(b <= a for a, b in zip(planned, planned[1:], strict=False)), job_id
    longest = max(duration for _, _, duration, _ in jobs)
    for job_id, submit, _, _ in jobs:
        assert started[job_id] - submit <= (older_pending[job_id] + 1) * longest, job_id
