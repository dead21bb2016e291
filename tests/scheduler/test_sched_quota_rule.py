"""The one quota check of a position: the user in the project and the project, each side by the
same comparison; admission asks it with nothing used or held."""

from __future__ import annotations

import pytest
from sched_factories import gpus, req

from scheduler import Quota, QuotaSide, admission_refusal, budget_nearly_used, position_refusal


def _sides(user: Quota, project: Quota, held=(0.0, 0.0)):
    return (QuotaSide("user", user, held[0]), QuotaSide("project", project, held[1]))


@pytest.mark.parametrize(
    ("user", "project", "held", "gpus", "hours", "refused"),
    [
        # max_gpus: held + asked within the limit, on each side.
        (Quota(max_gpus=4), Quota(), (2, 0), 2, 0, None),
        (Quota(max_gpus=4), Quota(), (2, 0), 3, 0, ("user", "max_gpus", 2, 3)),
        (Quota(max_gpus=100), Quota(max_gpus=4), (0, 2), 2, 0, None),
        (Quota(max_gpus=100), Quota(max_gpus=4), (0, 2), 3, 0, ("project", "max_gpus", 2, 3)),
        # Both full (a user without a limit of their own has the project's): the project binds.
        (Quota(max_gpus=4), Quota(max_gpus=4), (4, 4), 1, 0, ("project", "max_gpus", 4, 1)),
        # Sevenths fill a limit exactly.
        (Quota(max_gpus=1), Quota(), (3 / 7, 0), 4 / 7, 0, None),
        # gpu_hours_budget: used + asked within the budget, on each side.
        (Quota(gpu_hours_budget=10, gpu_hours_used=9), Quota(), (0, 0), 1, 1, None),
        (
            Quota(gpu_hours_budget=10, gpu_hours_used=9),
            Quota(),
            (0, 0),
            1,
            6,
            ("user", "gpu_hours_budget", 9, 6),
        ),
        (
            Quota(gpu_hours_budget=1000),
            Quota(gpu_hours_budget=10, gpu_hours_used=9.5),
            (0, 0),
            1,
            1,
            ("project", "gpu_hours_budget", 9.5, 1),
        ),
    ],
)
def test_it_checks_each_side_of_a_position(user, project, held, gpus, hours, refused):
    refusal = position_refusal(_sides(user, project, held), gpus=gpus, gpu_hours=hours)
    if refused is None:
        assert refusal is None
    else:
        assert (refusal.scope, refusal.limit, refusal.usage, refusal.asks) == refused


def test_it_refuses_at_admission_what_the_projects_limit_never_allows():
    sides = _sides(Quota(max_gpus=100), Quota(max_gpus=4, gpu_hours_budget=1000))
    refusal = admission_refusal(req("x", 5), gpus("a"), sides)
    assert (refusal.limit, refusal.scope, refusal.limit_value) == ("max_gpus", "project", 4)
    assert admission_refusal(req("x", 4), gpus("a"), sides) is None


def test_it_ignores_use_at_admission():
    used_up = _sides(Quota(gpu_hours_budget=10, gpu_hours_used=10), Quota(max_gpus=4), (0, 4))
    assert admission_refusal(req("x", 4, duration=3600), gpus("a"), used_up) is None


@pytest.mark.parametrize(("used", "warned"), [(8.9, False), (9 - 1 / 3600, False), (9.0, True)])
def test_it_warns_of_a_budget_when_one_more_gpu_second_would_pass_the_fraction(used, warned):
    side = QuotaSide("user", Quota(gpu_hours_budget=10, gpu_hours_used=used))
    assert budget_nearly_used(side, 0.9) is warned


# The reason a waiting booking gives names the limit that binds. A user with no limit of their
# own has the project's as theirs (the portal's effective quota): when bob alone holds the
# project's 6 GPUs both ledgers are full, and it is the project's limit that holds him back.
# fmt: off
BINDING_CASES = [
    # (case, user quota, project quota, bob holds, alice holds, bob asks, hours, the reason)
    ("only the project's limit, bob alone", Quota(max_gpus=6), Quota(max_gpus=6), 6, 0, 1, 0,
     "project nlp quota: 6 of 6 GPUs in use, needs 1"),
    ("the project's limit, filled by others", Quota(max_gpus=6), Quota(max_gpus=6), 2, 4, 1, 0,
     "project nlp quota: 6 of 6 GPUs in use, needs 1"),
    ("the user's own lower limit", Quota(max_gpus=2), Quota(max_gpus=6), 2, 0, 1, 0,
     "user bob@nlp quota: 2 of 2 GPUs in use, needs 1"),
    ("the user's own limit, no project limit", Quota(max_gpus=2), Quota(), 2, 0, 1, 0,
     "user bob@nlp quota: 2 of 2 GPUs in use, needs 1"),
    ("a project limit below the ask", Quota(max_gpus=6), Quota(max_gpus=6), 0, 0, 7, 0,
     "project nlp quota: limit 6 GPUs, asks 7"),
    ("a user limit below the ask", Quota(max_gpus=4), Quota(max_gpus=6), 0, 0, 5, 0,
     "user bob@nlp quota: limit 4 GPUs, asks 5"),
    ("only the project's budget", Quota(gpu_hours_budget=10, gpu_hours_used=9),
     Quota(gpu_hours_budget=10, gpu_hours_used=9), 0, 0, 1, 2,
     "project nlp GPU-hour budget: 9 of 10 used or planned, needs 2"),
    ("the user's own budget", Quota(gpu_hours_budget=5, gpu_hours_used=4),
     Quota(gpu_hours_budget=100, gpu_hours_used=4), 0, 0, 1, 2,
     "user bob@nlp GPU-hour budget: 4 of 5 used or planned, needs 2"),
]
# fmt: on


@pytest.mark.parametrize(
    ("case", "user", "project", "bob", "alice", "asks", "hours", "reason"), BINDING_CASES
)
def test_it_names_the_limit_that_binds(case, user, project, bob, alice, asks, hours, reason):
    from sched_factories import alloc, state

    from scheduler import Policy, plan

    held = [alloc(f"b{i}", [f"a-g{i}"], 500, user="bob@nlp", project="nlp") for i in range(bob)]
    held += [
        alloc(f"a{i}", [f"a-g{bob + i}"], 500, user="alice@nlp", project="nlp")
        for i in range(alice)
    ]
    duration = hours * 3600 / asks if hours else 100
    pending = req("x", asks, duration=duration, user="bob@nlp", project="nlp")
    result = plan(
        state(
            gpus("a", 16),
            [pending],
            held,
            user_quotas={"bob@nlp": user},
            project_quotas={"nlp": project},
        ),
        Policy(),
    )
    (line,) = [line for line in result.planned if line.booking_id == "x"]
    assert (line.reason, line.detail) == ("quota", reason), case
