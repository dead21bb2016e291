"""Every preset replayed on one site's history (scheduler/site_replay.py)."""

from __future__ import annotations

import pytest

from scheduler.replay import Job, cluster
from scheduler.site_replay import at_load, candidates, dominating, replay_presets
from scheduler.types import Policy


def _jobs() -> list[Job]:
    # Four jobs on 8 GPUs: a wide one first, then three narrow ones that queue behind it.
    specs = [("w", 0, 3600, 8), ("a", 10, 600, 2), ("b", 20, 600, 2), ("c", 30, 7200, 4)]
    return [
        Job(job_id, "u", "p", float(submit), float(run), float(run), gpus)
        for job_id, submit, run, gpus in specs
    ]


def test_it_replays_the_same_jobs_arriving_faster_at_a_higher_load():
    jobs = at_load(_jobs(), 2.0)
    assert [job.submit for job in jobs] == [0.0, 5.0, 10.0, 15.0]
    assert [job.duration for job in jobs] == [3600.0, 600.0, 600.0, 7200.0]  # runs unchanged


def test_it_offers_the_sites_own_policy_beside_the_default_and_every_reference_preset():
    mine = Policy(weight_age=1.0)
    names = list(candidates(mine))
    assert names[:2] == ["current", "portal"] and names[-1] == "portal-predict"
    assert {"easy-sjbf", "sjf-easy", "conservative"} <= set(names)
    assert candidates(mine)["current"] is mine
    assert candidates(mine)["portal-predict"].predict_last == 2


def test_it_gives_one_row_per_load_and_policy_with_the_widest_tenths_waits():
    policies = {
        name: p for name, p in candidates(Policy()).items() if name in ("portal", "sjf-easy")
    }
    seen = []
    rows = replay_presets(
        _jobs(), cluster(8, 8), policies, (1.0, 2.0), lambda *args: seen.append(args[:4])
    )
    assert [(row["load"], row["policy"]) for row in rows] == [
        (1.0, "portal"), (1.0, "sjf-easy"), (2.0, "portal"), (2.0, "sjf-easy"),
    ]  # fmt: skip
    assert seen[-1] == (4, 4, "sjf-easy", 2.0)
    for row in rows:
        assert row["jobs"] == 4 and row["widest_jobs"] == 1
        # The widest job (8 GPUs) is first in and starts at once.
        assert row["widest_mean_wait_s"] == 0.0
        assert row["max_wait_s"] >= 3600 - 30  # the last one waits for the wide one's end
    assert rows[0]["bound"] is not None  # the default keeps a no-starvation bound
    assert rows[1]["bound"] is None  # shortest-first backfill without protection does not


@pytest.mark.parametrize(
    ("mine", "theirs", "dominated"),
    [
        ({"mean_wait_s": 10, "p99_wait_s": 10, "max_wait_s": 10, "utilization": 0.5},
         {"mean_wait_s": 5, "p99_wait_s": 10, "max_wait_s": 10, "utilization": 0.5}, True),
        ({"mean_wait_s": 10, "p99_wait_s": 10, "max_wait_s": 10, "utilization": 0.5},
         {"mean_wait_s": 5, "p99_wait_s": 20, "max_wait_s": 10, "utilization": 0.5}, False),
        ({"mean_wait_s": 10, "p99_wait_s": 10, "max_wait_s": 10, "utilization": 0.5},
         {"mean_wait_s": 10, "p99_wait_s": 10, "max_wait_s": 10, "utilization": 0.5}, False),
    ],
)  # fmt: skip
def test_it_names_the_policies_that_dominate_the_current_one(mine, theirs, dominated):
    rows = [{"policy": "current", "load": 1.0, **mine}, {"policy": "x", "load": 1.0, **theirs}]
    rows.append({"policy": "y", "load": 2.0, **theirs})  # another load: not compared
    assert dominating(rows, "current") == (["x"] if dominated else [])
