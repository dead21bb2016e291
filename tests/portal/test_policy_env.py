"""Every field of the allocator's Policy is a validated setting (SCHEDULER_<FIELD>)."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured

import scheduler
from portal.policy_env import policy_env_names, policy_settings

# A valid value other than the default for every field, as it would be written in the environment.
VALUES = {
    "weight_age": ("10", 10.0),
    "weight_fairshare": ("0", 0.0),
    "weight_size": ("2.5", 2.5),
    "weight_qos": ("7", 7.0),
    "run_quantile": ("0.75", 0.75),
    "run_floor_s": ("60", 60.0),
    "age_max_runs": ("3", 3.0),
    "size_scale_share": ("2", 2.0),
    "size_width_share": ("none", None),
    "size_fades_with_age": ("false", False),
    "size_by": ("seconds", "seconds"),
    "protect_after_runs": ("2", 2.0),
    "protect_after_max_s": ("3600", 3600.0),
    "protect_oldest": ("3", 3),
    "age_max_s": ("86400", 86400.0),
    "size_scale_gpu_s": ("1000", 1000.0),
    "size_width_gpus": ("16", 16.0),
    "fairshare_half_life_s": ("1000", 1000.0),
    "fairshare_charge": ("measured", "measured"),
    "fairshare_idle_floor": ("0.1", 0.1),
    "fairshare_blend": ("0.7", 0.7),
    "qos_levels": ("low:0,normal:1,high:5", (("low", 0), ("normal", 1), ("high", 5))),
    "preempt_grace_s": ("0", 0.0),
    "backfill": ("conservative", "conservative"),
    "order": ("sjf", "sjf"),
    "reservation_depth": ("8", 8),
    "estimate_all": ("false", False),
    "explain": ("false", False),
    "predict_last": ("2", 2),
    "topology_wait_s": ("600", 600.0),
    "reclaim_grace_s": ("900", 900.0),
    "reclaim_warning_s": ("60", 60.0),
    "default_cpus_per_gpu": ("4", 4.0),
    "default_memory_mib_per_gpu": ("16384", 16384),
}


def test_it_lets_every_policy_field_be_set_from_the_environment():
    names = policy_env_names()
    assert set(VALUES) == {f.name for f in dataclasses.fields(scheduler.Policy)}
    overrides = policy_settings({names[field]: text for field, (text, _) in VALUES.items()})
    policy = scheduler.Policy(**overrides)
    for field, (_, value) in VALUES.items():
        assert getattr(policy, field) == value, field
        assert value != getattr(scheduler.Policy(), field), field


@pytest.mark.parametrize(
    ("name", "text", "word"),
    [
        ("SCHEDULER_BACKFILL", "aggressive", "backfill must be one of"),
        ("SCHEDULER_SIZE_BY", "gpus", "size_by"),
        ("SCHEDULER_WEIGHT_AGE", "-1", "weight_age"),
        ("SCHEDULER_WEIGHT_AGE", "lots", "SCHEDULER_WEIGHT_AGE"),
        ("SCHEDULER_RUN_QUANTILE", "1.5", "run_quantile"),
        ("SCHEDULER_RESERVATION_DEPTH", "0", "reservation_depth"),
        ("SCHEDULER_ESTIMATE_ALL", "maybe", "SCHEDULER_ESTIMATE_ALL"),
        ("SCHEDULER_QOS_LEVELS", "low,high", "SCHEDULER_QOS_LEVELS"),
        ("SCHEDULER_FAIRSHARE_CHARGE", "utilization", "fairshare_charge must be one of"),
        ("SCHEDULER_FAIRSHARE_IDLE_FLOOR", "1.5", "fairshare_idle_floor must be in"),
        ("SCHEDULER_FAIRSHARE_BLEND", "-0.1", "fairshare_blend must be in"),
        ("SCHEDULER_RECLAIM_GRACE_S", "-5", "reclaim_grace_s must be >= 0"),
        ("SCHEDULER_RECLAIM_WARNING_S", "600", "reclaim_grace_s must be at least"),
    ],
)
def test_it_refuses_an_invalid_policy_setting_at_load(name, text, word):
    with pytest.raises(ImproperlyConfigured, match=word):
        policy_settings({name: text})


def test_it_refuses_an_unknown_backfill_in_the_policy_itself():
    with pytest.raises(ValueError, match="backfill"):
        scheduler.Policy(backfill="aggressive")


def test_it_starts_from_a_named_preset_and_lets_a_field_override_it():
    overrides = policy_settings(
        {"SCHEDULER_PRESET": "sjf-protect-1d", "SCHEDULER_PROTECT_AFTER_MAX_S": "3600"}
    )
    policy = scheduler.Policy(**overrides)
    assert (policy.order, policy.backfill, policy.protect_oldest) == ("sjf", "easy", 0)
    assert policy.protect_after_max_s == 3600.0


def test_it_refuses_an_unknown_preset_at_load():
    with pytest.raises(ImproperlyConfigured, match="SCHEDULER_PRESET='fastest'"):
        policy_settings({"SCHEDULER_PRESET": "fastest"})


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"SCHEDULER_RECLAIM_GRACE_S": "10"}, True),  # shorter than the 30 s kill wait
        ({"SCHEDULER_RECLAIM_GRACE_S": "10", "JOB_KILL_WAIT_S": "5"}, False),
        ({"SCHEDULER_RECLAIM_GRACE_S": "60"}, False),
    ],
)
def test_it_refuses_a_reclaim_grace_shorter_than_the_warning_at_load(env, refused):
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", "import portal.settings"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (run.returncode != 0) is refused, run.stderr
    if refused:
        assert "SCHEDULER_RECLAIM_GRACE_S=10 must be at least the warning" in run.stderr
