"""scheduler/notebooks.py: the notebook-heavy queue is deterministic and takes the share asked."""

from __future__ import annotations

import json

import pytest

from scheduler.notebooks import notebook_jobs, notebook_replay, openb_fractions
from scheduler.replay import Job
from scheduler.replay import main as replay_main

FRACTIONS = (0.25, 0.5, 0.81)


def jobs(n_single=40, n_wide=10):
    out = [Job(f"s{i}", "u", "all", float(i), 100.0, 100.0, 1) for i in range(n_single)]
    out += [Job(f"w{i}", "u", "all", float(i), 100.0, 100.0, 4) for i in range(n_wide)]
    return sorted(out, key=lambda job: job.submit)


@pytest.mark.parametrize(("share", "expected"), [(0.0, 0), (0.4, 16), (0.25, 10), (1.0, 40)])
def test_it_turns_exactly_the_share_asked_of_the_one_gpu_jobs_into_notebooks(share, expected):
    out = notebook_jobs(jobs(), share, FRACTIONS, seed=3)
    notebooks = [job for job in out if job.fraction < 1]
    assert len(notebooks) == expected
    assert all(job.gpus == 1 and job.fraction in FRACTIONS for job in notebooks)
    # Nothing else changes: same jobs, same order, same times.
    assert [(j.job_id, j.submit, j.duration, j.gpus) for j in out] == [
        (j.job_id, j.submit, j.duration, j.gpus) for j in jobs()
    ]


def test_it_gives_the_same_queue_for_a_seed_and_another_for_another_seed():
    first = notebook_jobs(jobs(), 0.4, FRACTIONS, seed=7)
    assert notebook_jobs(jobs(), 0.4, FRACTIONS, seed=7) == first
    assert notebook_jobs(jobs(), 0.4, FRACTIONS, seed=8) != first


def test_it_draws_fractions_from_the_distribution_it_is_given():
    out = notebook_jobs(jobs(400, 0), 1.0, (0.25, 0.25, 0.25, 0.5), seed=1)
    quarters = sum(1 for job in out if job.fraction == 0.25)
    assert 250 <= quarters <= 350  # three in four, drawn with replacement


@pytest.mark.parametrize(
    ("share", "fractions", "message"),
    [(1.5, FRACTIONS, "share must be in"), (0.4, (), "non-empty"), (0.4, (1.0,), "in \\(0, 1\\)")],
)
def test_it_refuses_a_share_or_fractions_out_of_bounds(share, fractions, message):
    with pytest.raises(ValueError, match=message):
        notebook_jobs(jobs(), share, fractions)


def test_it_reads_the_fractions_of_a_pod_trace(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(
        "job_id,submit_time_s,duration_s,num_gpus,gpu_fraction\n"
        "a,0,10,1,0.5\nb,1,10,1,1\nc,2,10,2,1\nd,3,10,1,0.25\n"
    )
    assert openb_fractions(str(path)) == (0.5, 0.25)


def write_traces(tmp_path):
    """Eight 1-GPU jobs at once on a cluster of 2 nodes of 2 GPUs; openb asks halves only."""
    trace = tmp_path / "public_t.csv"
    rows = [f"j{i},,0,1000,1" for i in range(8)]
    trace.write_text("job_id,user,submit_time_s,duration_s,num_gpus\n" + "\n".join(rows) + "\n")
    pods = tmp_path / "openb_gpushare.csv"
    pods.write_text("job_id,submit_time_s,duration_s,num_gpus,gpu_fraction\np,0,10,1,0.5\n")
    return str(trace), str(pods)


def test_it_replays_the_notebook_queue_shared_and_exclusive_on_the_same_cluster(tmp_path):
    trace, pods = write_traces(tmp_path)
    out = notebook_replay(
        trace, 4, "easy", share=0.5, fractions_path=pods, shared_nodes=1, gpus_per_node=2
    )
    assert (out["notebooks"], out["shared_gpus"]) == (4, 2)
    shared, exclusive = out["shared"], out["exclusive"]
    # Shared: the four half-GPU notebooks fit on the 2 shared GPUs at once, the 4 whole jobs
    # take the 2 other GPUs in two rounds. Exclusive: 8 whole GPUs' worth on 4 GPUs.
    assert (shared["notebook_jobs"], shared["whole_jobs"]) == (4, 4)
    assert shared["notebook_mean_wait_s"] == 0.0
    assert shared["whole_mean_wait_s"] == 500.0
    assert exclusive["mean_wait_s"] == 500.0
    assert shared["makespan_s"] == exclusive["makespan_s"] == 2000.0
    # Asked: 4 x 0.5 + 4 x 1 GPU-equivalents for 1000 s; held: notebooks hold whole GPUs only
    # when exclusive.
    assert exclusive["utilization"] == pytest.approx(6000 / (4 * 2000))
    assert exclusive["allocated_utilization"] == pytest.approx(8000 / (4 * 2000))
    assert shared["allocated_utilization"] == pytest.approx(6000 / (4 * 2000))


def test_it_runs_from_the_replay_command_line(tmp_path, capsys):
    trace, pods = write_traces(tmp_path)
    argv = [trace, "--gpus", "4", "--gpus-per-node", "2", "--policy", "easy"]
    assert replay_main([*argv, "--notebook-share", "0.5", "--shared-nodes", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["notebooks"] == 4 and {"shared", "exclusive"} <= set(out)
    with pytest.raises(SystemExit):
        replay_main([*argv, "--notebook-share", "0.5", "--shared-nodes", "2"])
    assert "leave both shared and whole GPUs" in capsys.readouterr().err
