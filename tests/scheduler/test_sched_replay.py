"""Replay on a tiny synthetic trace: every named policy runs and reports sane metrics."""

from __future__ import annotations

import json

import pytest

from scheduler.replay import POLICIES, main, replay_trace

FIELDS = {
    "policy",
    "jobs",
    "gpus",
    "mean_wait_s",
    "p50_wait_s",
    "p95_wait_s",
    "p99_wait_s",
    "max_wait_s",
    "mean_jct_s",
    "mean_bsld",
    "utilization",
    "makespan_s",
    "skipped",
}
ROWS = [
    # job_id,user,submit_time_s,duration_s,num_gpus,vc
    ("j1", 0, 1000, 8, "red"),
    ("j2", 10, 1000, 24, "blue"),  # waits for j1's node: j3 and j4 can backfill the gap
    ("j3", 20, 200, 2, "red"),
    ("j4", 30, 300, 1, "blue"),
    ("j5", 40, 100, 64, "red"),  # larger than the cluster: skipped
    ("j6", 50, 5000, 4, "blue"),
]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "tiny.csv"
    lines = ["job_id,user,submit_time_s,duration_s,num_gpus,vc"]
    lines += [f"{j},,{s},{d},{g},{vc}" for j, s, d, g, vc in ROWS]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_it_replays_every_policy_with_sane_metrics(trace, policy):
    result = replay_trace(trace, gpus=24, policy=policy)
    assert FIELDS <= set(result)
    assert (result["jobs"], result["skipped"], result["policy"]) == (5, 1, policy)
    assert 0 < result["utilization"] <= 1
    assert (
        0
        <= result["p50_wait_s"]
        <= result["p95_wait_s"]
        <= result["p99_wait_s"]
        <= result["max_wait_s"]
    )
    assert result["mean_bsld"] >= 1
    assert result["makespan_s"] >= 5000 + 50


def test_it_lets_backfill_beat_fifo_on_a_trace_with_a_gap(trace):
    fifo = replay_trace(trace, gpus=24, policy="fifo")
    easy = replay_trace(trace, gpus=24, policy="easy")
    portal = replay_trace(trace, gpus=24, policy="portal")
    assert easy["mean_wait_s"] < fifo["mean_wait_s"]
    assert portal["mean_wait_s"] < fifo["mean_wait_s"]


def test_it_counts_the_time_a_job_really_runs_with_padded_estimates(trace):
    exact = replay_trace(trace, gpus=24, policy="easy")
    padded = replay_trace(trace, gpus=24, policy="easy", estimate_factor=3.0)
    assert padded["makespan_s"] >= exact["makespan_s"] - 1e-9
    assert padded["utilization"] <= exact["utilization"] + 1e-9


def test_it_prints_one_json_line_with_projects_from_a_column(trace, capsys):
    assert main([trace, "--gpus", "24", "--policy", "portal", "--project-column", "vc"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    result = json.loads(out[0])
    assert set(result["projects"]) == {"red", "blue"}
    assert result["projects"]["red"]["share"] == 0.5
    assert result["projects"]["blue"]["gpu_hours"] == pytest.approx(
        (24 * 1000 + 300 + 4 * 5000) / 3600, abs=0.1
    )


def test_it_runs_a_reference_policy_by_name_from_the_command_line(trace, capsys):
    assert main([trace, "--gpus", "24", "--policy", "sjf-protect-1d"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "sjf-protect-1d"


def test_it_hashes_users_into_projects_with_a_share_of_the_cluster_each():
    from scheduler.replay_quotas import parse_quota_model

    model = parse_quota_model("4x0.25", borrowing=True)
    assert model.limit(80) == 20.0 and model.label == "4x0.25+borrowing"
    assert {model.project_of(f"synthetic-{i}") for i in range(32)} == {
        f"project-{i}" for i in range(4)
    }
    for bad in ("4", "0x0.5", "4x0", "4x1.5", "ax0.5"):
        with pytest.raises(ValueError, match="quota model"):
            parse_quota_model(bad)


def test_it_replays_a_quota_model_with_borrowing_and_counts_the_waits_within_it(tmp_path):
    from scheduler.replay_quotas import QuotaModel

    # One user (so one project), limited to 4 of 8 GPUs: without borrowing the second 4-GPU
    # job waits for the first; with it, it starts borrowed at once.
    trace = tmp_path / "t.csv"
    trace.write_text(
        "job_id,user,submit_time_s,duration_s,num_gpus\nj1,u,0,1000,4\nj2,u,0,1000,4\n"
    )
    off = replay_trace(str(trace), 8, "portal", quotas=QuotaModel(1, 0.5))
    on = replay_trace(str(trace), 8, "portal", quotas=QuotaModel(1, 0.5, borrowing=True))
    assert off["max_wait_s"] == 1000.0 and off["borrowed_jobs"] == 0
    assert on["max_wait_s"] == 0.0 and on["borrowed_jobs"] == 1 and on["within_jobs"] == 1
    assert on["borrowed_gpu_hours"] == pytest.approx(4000 / 3600)
