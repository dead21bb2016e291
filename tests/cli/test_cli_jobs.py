"""`gpu-portal submit --nodes/--workdir/--env/--signal` and `show` of a job's environment and of
each node's process, against the live server."""

import json

import pytest

from portal.models import Booking, NodeRun
from tests.bounded import PEAK_MAX, measured
from tests.cli.conftest import token_for
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_submits_a_job_with_its_environment_and_shows_it(site, cli):
    token = token_for(site["alice"])
    result = cli(
        "submit", "-g", "2", "-N", "1", "-t", "1h", "--workdir", "/scratch/run",
        "--env", "LR=3e-4", "--env", "TAG=a=b", "--signal", "USR1@120",
        "--", "python", "train.py", token=token,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    booking = Booking.objects.get()
    assert (booking.gpus, booking.workdir) == (2, "/scratch/run")
    assert booking.env == {"LR": "3e-4", "TAG": "a=b"}
    assert (booking.signal_name, booking.signal_before_s) == ("USR1", 120)
    shown = cli("show", str(booking.pk), token=token).stdout
    assert "Working directory:     /scratch/run" in shown
    assert f"Output file:           gpu-portal-{booking.pk}.out" in shown
    assert "Environment:           LR=3e-4 TAG=a=b" in shown
    assert "Signal:                USR1@120" in shown


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--env", "NOEQUALS"], "'NOEQUALS': write NAME=VALUE"),
        (["--env", "MASTER_ADDR=x"], "env.MASTER_ADDR: is set by the portal"),
        (["--signal", "KILL"], "signal: 'KILL' is not a signal a job can catch"),
        (["--workdir", "rel"], "workdir: must be an absolute path"),
    ],
)
def test_it_refuses_a_bad_job_environment_naming_the_option(site, cli, args, said):
    token = token_for(site["alice"])
    result = cli("submit", "-t", "1h", *args, "--", "true", token=token)
    assert result.returncode != 0
    assert said in result.stderr, result.stderr
    assert not Booking.objects.exists()


def test_it_sends_an_array_spec_unexpanded_and_the_portal_refuses_a_huge_one_at_once(site, cli):
    # The client passes --array through as written (it expands nothing); the portal measures
    # each range before making ids. The live server runs in this process, so its memory is
    # traced and capped here.
    token = token_for(site["alice"])
    cli("submit", "-t", "10m", "--array", "0-5000", "--", "true", token=token)  # a warm server
    with measured() as cost:
        result = cli(
            "submit", "-t", "10m", "--array", "0-99999999999999999999", "--", "true", token=token
        )  # fmt: skip
    assert result.returncode != 0
    assert "array: an array has at most 1000 tasks" in result.stderr, result.stderr
    assert cost.peak < PEAK_MAX, cost
    assert cost.seconds < 20, cost  # a Python start and one request, on a loaded machine
    assert not Booking.objects.exists()


def test_it_shows_each_nodes_process_and_exit_code(site, cli):
    other = make_node("cli-b", gpus=2)
    gpus = [site["node"].gpus.get(index=0), other.gpus.get(index=0)]
    booking = make_active_booking(gpus, owner=site["alice"], project=site["project"], gpus=2,
                                  command="train")  # fmt: skip
    NodeRun.objects.create(booking=booking, node=site["node"], rank=0, state="stopped")
    NodeRun.objects.create(booking=booking, node=other, rank=1, state="exited", exit_code=3,
                           log_tail="boom\n")  # fmt: skip
    token = token_for(site["alice"])
    lines = cli("show", str(booking.pk), token=token).stdout.splitlines()
    at = lines.index(next(line for line in lines if line.split()[:2] == ["RANK", "NODE"]))
    assert lines[at + 1].split() == ["0", "cli-a", "stopped", "-"]
    assert lines[at + 2].split() == ["1", "cli-b", "exited", "3"]
    body = json.loads(cli("show", "--json", str(booking.pk), token=token).stdout)
    assert body["nodes"][1]["log_tail"] == "boom\n"


def test_it_books_any_model_only_when_asked_and_shows_each_nodes_devices_apart(site, cli):
    site["project"].quotas.update(max_gpus=None)
    make_node("cli-b", gpus=2), make_node("cli-h", gpus=2, model="H100-80GB")
    token = token_for(site["alice"])
    # 4 GPUs of one model: cli-b's 2 A100 are the only whole node of A100 (cli-a has MIG).
    refused = cli("submit", "-g", "4", "-t", "1h", token=token)
    assert refused.returncode == 5, refused.stderr
    assert "whole GPUs of one model" in refused.stderr
    result = cli("submit", "--json", "-g", "4", "--any-model", "-t", "1h", token=token)
    assert result.returncode == 0, result.stderr
    booking = json.loads(result.stdout)
    assert booking["mixed_models"] is True
    assert Booking.objects.get().mixed_models is True
    lines = cli("show", str(booking["id"]), token=token).stdout.splitlines()
    assert "What:                  4 GPU any models" in lines
    for node, model in (("cli-b", "A100-80GB"), ("cli-h", "H100-80GB")):
        at = lines.index(f"{node}: 2 devices, {model}")
        assert lines[at + 1].split()[:2] == ["DEVICE", "UUID"]
        assert [line.split()[0] for line in lines[at + 2 : at + 4]] == [
            f"{node}/gpu0",
            f"{node}/gpu1",
        ]
