"""`gpu-portal` driven as a user would, as a subprocess against a live portal: every command,
its human and --json output, and the exit codes scripts test."""

import json
import stat
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from agents import protocol
from portal.models import Booking, Gpu, MigInstance, Node, Notification
from portal.services.allocation.allocation import allocation_pass
from portal.services.booking.bookings import booking_cancel, booking_stop, booking_transition
from portal.services.fleet.agents import agent_events_record
from portal.services.inventory.telemetry_cache import latest_store
from tests.cli.conftest import token_for
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db(transaction=True)


def _json(result):
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_it_logs_in_with_a_password_and_stores_the_token_readable_by_its_owner_only(site, cli):
    wrong = cli("login", "-u", "alice", "--password-stdin", stdin="nope\n")
    assert wrong.returncode == 1
    assert "Wrong username or password." in wrong.stderr

    result = cli("login", "-u", "alice", "--password-stdin", stdin="pw-secret-123\n")
    assert result.returncode == 0, result.stderr
    path = cli.home / ".config" / "gpu-portal" / "config.json"
    assert f"as alice; token stored in {path}" in result.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored["username"] == "alice" and stored["token"].startswith("gp")

    # The stored token is used with no GPU_PORTAL_TOKEN set; a bad one in the env overrides it.
    assert "vision" in cli("quota").stdout
    refused = cli("quota", token="gp-not-a-token")
    assert refused.returncode == 3
    assert "Invalid or revoked token." in refused.stderr and "gpu-portal login" in refused.stderr


def test_it_says_not_logged_in_without_a_token(site, cli):
    result = cli("list")
    assert result.returncode == 3
    assert "Not logged in" in result.stderr


def test_it_submits_then_shows_lists_and_queues_with_position_and_reason(site, cli):
    token = token_for(site["alice"])
    first = cli(
        "submit", "-g", "2", "-t", "1h", "--", "python", "train.py", "--lr", "0.1", token=token
    )
    assert first.returncode == 0, first.stderr
    running = Booking.objects.get()
    assert first.stdout.startswith(f"Submitted booking {running.pk}\n")
    assert running.command == "python train.py --lr 0.1" and running.duration_s == 3600
    # The allocation pass after the commit started it on the two free GPUs.
    assert "State:                 active" in first.stdout

    waiting = _json(cli("submit", "--json", "-g", "1", "-t", "30m", token=token))
    assert waiting["state"] == "pending" and waiting["duration_s"] == 1800

    queue = cli("queue", token=token)
    assert queue.returncode == 0, queue.stderr
    lines = queue.stdout.splitlines()
    assert lines[0].split() == [
        "ID", "USER", "PROJECT", "STATE", "WHAT", "POS", "START", "END", "REASON"
    ]  # fmt: skip
    assert lines[1].split()[:5] == [str(running.pk), "alice", "vision", "active", "2"]
    assert lines[2].split()[:4] == [str(waiting["id"]), "alice", "vision", "pending"]
    assert lines[2].split()[6] == "1" and lines[2].split()[-1] == "resources"
    assert [b["id"] for b in _json(cli("queue", "--json", token=token))] == [
        running.pk,
        waiting["id"],
    ]
    assert _json(cli("queue", "--json", "-o", "bob", token=token)) == []

    shown = cli("show", str(running.pk), token=token)
    assert "State:                 active" in shown.stdout
    assert "cli-a/gpu0" in shown.stdout and "cli-a/gpu1" in shown.stdout
    assert "Command:               python train.py --lr 0.1" in shown.stdout

    listed = cli("list", token=token)
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == [
        str(waiting["id"]),
        str(running.pk),
    ]
    only_pending = _json(cli("list", "--state", "pending", "--json", token=token))
    assert [b["id"] for b in only_pending] == [waiting["id"]]


def test_it_waits_for_a_start_and_gives_up_after_the_timeout(site, cli):
    token = token_for(site["alice"])
    started = cli(
        "submit", "--wait", "--interval", "0.2", "--mig", "3g.40gb", "-t", "1h", token=token
    )
    assert started.returncode == 0, started.stderr
    assert "is active" in started.stdout and "cli-a/gpu2/3g.40gb" in started.stdout

    assert cli("submit", "-g", "2", "-t", "1h", token=token).returncode == 0
    late = cli(
        "submit", "--wait", "--wait-timeout", "1", "--interval", "0.2", "-g", "1", "-t", "1h",
        token=token,
    )  # fmt: skip
    assert late.returncode == 7
    assert "pending, position 1, planned start " in late.stderr and "reason quota" in late.stderr
    assert "has not started after 1 s" in late.stderr


def test_it_estimates_without_writing_and_reads_either_field_naming(site, cli):
    token = token_for(site["alice"])
    result = cli("estimate", "-g", "1", "-t", "2h", token=token)
    assert result.returncode == 0, result.stderr
    assert "Earliest start:" in result.stdout and "Reason:" in result.stdout
    answer = _json(cli("estimate", "--json", "-g", "1", "-t", "2h", token=token))
    assert {"queue_position"} <= set(answer)
    assert Booking.objects.count() == 0


def test_it_estimates_the_next_window_when_a_window_does_not_fit(site, cli):
    token = token_for(site["alice"])
    held = _json(cli("submit", "--json", "-g", "1", "-t", "1h", token=token))
    assert held["state"] == "active"  # one of the node's two GPUs, for an hour
    start = (timezone.now() + timedelta(minutes=10)).replace(microsecond=0)
    asked = ("estimate", "-g", "2", "--start", start.isoformat(), "-t", "30m")
    answer = _json(cli(*asked[:1], "--json", *asked[1:], token=token))
    assert answer["pending_reason"] == "no_capacity"
    window = answer["next_window"]
    assert window["start"] == held["end"]  # when the two GPUs free up, for the same 30 min
    end = timezone.datetime.fromisoformat(window["end"])
    assert end - timezone.datetime.fromisoformat(window["start"]) == timedelta(minutes=30)
    shown = cli(*asked, token=token)
    assert shown.returncode == 0, shown.stderr
    (line,) = [row for row in shown.stdout.splitlines() if row.startswith("Next window:")]
    assert " to " in line


def test_it_extends_cancels_and_releases(site, cli):
    token = token_for(site["alice"])
    active = _json(cli("submit", "--json", "-g", "1", "-t", "1h", token=token))
    assert active["state"] == "active"
    before = Booking.objects.get(pk=active["id"]).allocations.get().end

    extended = cli("extend", str(active["id"]), "30m", token=token)
    assert extended.returncode == 0, extended.stderr
    assert extended.stdout.startswith(f"Extended by 30m: booking {active['id']} (active, ends ")
    after = Booking.objects.get(pk=active["id"]).allocations.get().end
    assert after - before == timedelta(minutes=30)

    released = cli("release", str(active["id"]), token=token)
    assert released.stdout == f"Released booking {active['id']} (finished)\n"

    start = (timezone.now() + timedelta(days=2)).replace(microsecond=0)
    planned = _json(cli("submit", "--json", "--start", start.isoformat(), "-t", "1h", token=token))
    assert planned["state"] == "planned"
    assert Booking.objects.get(pk=planned["id"]).end == start + timedelta(hours=1)
    cancelled = cli("cancel", str(planned["id"]), token=token)
    assert cancelled.stdout == f"Cancelled booking {planned['id']} (cancelled)\n"
    again = cli("cancel", str(planned["id"]), token=token)
    assert again.returncode == 5 and "[invalid_state]" in again.stderr


def test_it_cancels_a_whole_array_in_one_call(site, cli):
    token = token_for(site["alice"])
    submitted = cli(
        "submit", "--json", "-g", "1", "-t", "1h", "--array", "0-4", "--", "run", token=token
    )
    array = _json(submitted)["id"]
    cancelled = cli("cancel", "--array", str(array), token=token)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"Cancelled 5 tasks of array {array} (5 cancelled)\n"
    states = Booking.objects.filter(array_parent_id=array).values_list("state", flat=True)
    assert set(states) == {"cancelled"}
    # One digest, not a message per task.
    ended = Notification.objects.filter(booking__array_parent_id=array, event="ended")
    assert [n.key for n in ended] == [f"array:{array}:ended"]
    again = cli("cancel", "--array", str(array), token=token)
    assert again.returncode == 5 and "[invalid_state]" in again.stderr


def test_it_shows_quota_with_usage(site, cli):
    token = token_for(site["alice"])
    assert cli("submit", "-g", "2", "-t", "1h", token=token).returncode == 0
    result = cli("quota", token=token)
    assert result.returncode == 0, result.stderr
    row = result.stdout.splitlines()[1].split()
    assert row[:4] == ["vision", "member", "2/3", "0.0/unlimited"]
    assert _json(cli("quota", "--json", token=token))[0]["limits"]["max_gpus"] == 3


def test_it_lists_devices_free_now_with_their_latest_readings(site, cli):
    token = token_for(site["alice"])
    gpu0, gpu1 = Gpu.objects.filter(mig_mode=False).order_by("index")
    make_active_booking([gpu0], owner=site["alice"], project=site["project"])
    latest_store(
        {
            gpu1.uuid: {
                "time": timezone.now().isoformat(),
                "utilization_gpu": 37.0,
                "memory_used_mib": 2048,
                "memory_total_mib": 81920,
                "temperature_c": 41.0,
                "power_w": 95.0,
                "processes": [],
            }
        }
    )
    result = cli("gpus", token=token)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}
    assert "cli-a/gpu0" not in rows  # held now
    reading = ["37%", "2.0/80", "GiB", "41C", "95W", "0"]
    assert rows["cli-a/gpu1"][1:] == ["A100-80GB", "80", "GiB", *reading]
    # Each slice by the API's label, profile@first compute slice: the two 1g.10gb differ.
    slices = {"3g.40gb@0", "2g.20gb@3", "1g.10gb@5", "1g.10gb@6"}
    assert {f"cli-a/gpu2/{name}" for name in slices} <= set(rows)
    assert "cli-a/gpu2" not in rows  # in MIG mode: its slices are what one books

    everything = _json(cli("gpus", "--all", "--json", token=token))
    assert [(g["index"], g["free"]) for g in everything["gpus"]] == [
        (0, False),
        (1, True),
        (2, False),
    ]
    assert len(everything["mig_instances"]) == MigInstance.objects.count()
    assert all(m["free"] for m in everything["mig_instances"])
    marked = cli("gpus", "--all", token=token).stdout.splitlines()
    assert marked[0].split()[:2] == ["DEVICE", "FREE"]
    assert marked[1].split()[:2] == ["cli-a/gpu0", "no"] and marked[2].split()[:2] == [
        "cli-a/gpu1",
        "yes",
    ]


def test_it_prints_a_batch_bookings_output(site, cli):
    token = token_for(site["alice"])
    gpu = Gpu.objects.get(index=0)
    booking = make_active_booking([gpu], owner=site["alice"], project=site["project"])
    Booking.objects.filter(pk=booking.pk).update(
        state=Booking.State.FINISHED, exit_code=0, log_tail="epoch 1 loss 0.5\nepoch 2 loss 0.3\n"
    )
    result = cli("logs", str(booking.pk), token=token)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "epoch 1 loss 0.5\nepoch 2 loss 0.3\n"
    followed = cli("logs", "--follow", "--interval", "0.2", str(booking.pk), token=token)
    assert followed.stdout == result.stdout  # an ended booking: printed once, then it returns
    assert _json(cli("logs", "--json", str(booking.pk), token=token))["state"] == "finished"


def test_it_exits_with_codes_scripts_can_test_and_the_apis_message(site, cli):
    token = token_for(site["alice"])
    missing = cli("show", "999999", token=token)
    assert missing.returncode == 4
    assert "No booking 999999 among yours. [not_found]" in missing.stderr

    start = (timezone.now() + timedelta(days=1)).replace(microsecond=0).isoformat()
    end = (timezone.now() + timedelta(days=1, hours=1)).replace(microsecond=0).isoformat()
    over = cli("submit", "-g", "2", "--start", start, "--end", end, token=token)
    assert over.returncode == 0, over.stderr
    refused = cli("submit", "-g", "2", "--start", start, "--end", end, token=token)
    assert refused.returncode == 5
    assert "Quota max_gpus" in refused.stderr and "[quota" in refused.stderr
    as_json = cli("submit", "--json", "-g", "2", "--start", start, "--end", end, token=token)
    assert as_json.returncode == 5
    assert json.loads(as_json.stdout)["error"]["code"].startswith("quota")

    invalid = cli("submit", "--mig", "9g.99gb", "-t", "1h", token=token)
    assert invalid.returncode == 1 and "mig_profile" in invalid.stderr

    for usage in (["submit", "-g", "two"], ["submit", "-t", "soon"], ["extend", "1"], ["nope"]):
        assert cli(*usage, token=token).returncode == 2, usage

    unreachable = cli("list", token=token, url="http://127.0.0.1:9")
    assert unreachable.returncode == 6 and "Cannot reach http://127.0.0.1:9" in unreachable.stderr


def _until(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_it_stops_waiting_with_exit_8_when_the_booking_ends_without_starting(site, cli):
    token = token_for(site["alice"])
    assert cli("submit", "-g", "2", "-t", "1h", token=token).returncode == 0
    waiting = cli.start("submit", "--wait", "--interval", "0.2", "-g", "1", "-t", "1h", token=token)
    _until(lambda: Booking.objects.filter(state="pending").exists())
    queued = Booking.objects.get(state="pending")
    booking_cancel(user=site["alice"], booking_id=queued.pk, now=timezone.now())
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 8, err
    assert f"Booking {queued.pk} ended without starting" in out and "cancelled" in out


def _exit_on(node, booking_id: int, code: int) -> None:
    """What the node's agent reports when the booking's command exits."""
    event = protocol.Event("exited", timezone.now(), "exited", booking_id, exit_code=code)
    agent_events_record(node=node, request=protocol.EventsRequest([event]))


def _waiting(cli, token: str, *args: str):
    """`submit --wait ARGS` in the background, once it said the booking waits (it polls again
    `--interval` 2 s later: what the test does now happens between two polls)."""
    waiting = cli.start("submit", "--wait", "--interval", "2", *args, token=token)
    assert waiting.stderr.readline().startswith("Submitted booking ")
    assert ": pending" in waiting.stderr.readline()
    return waiting, Booking.objects.get(state="pending")


def _blocker(gpus) -> Booking:
    return make_active_booking(list(gpus))


@pytest.mark.parametrize(
    ("code", "exit_code", "said"),
    [(0, 0, "ran and finished"), (1, 8, "ran and ended failed")],
    ids=["finished", "failed"],
)
def test_it_exits_by_the_outcome_of_a_short_job_that_ran_between_two_polls(
    site, cli, code, exit_code, said
):
    # Before: both exited 8 saying "ended without starting".
    token = token_for(site["alice"])
    blocker = _blocker(Gpu.objects.filter(node=site["node"], mig_mode=False))
    waiting, job = _waiting(cli, token, "-g", "1", "-t", "1h", "--", "sh", "-c", f"exit {code}")
    booking_transition(blocker.pk, to="finished", now=timezone.now())
    allocation_pass(now=timezone.now())
    _exit_on(site["node"], job.pk, code)
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == exit_code, err
    assert f"Booking {job.pk} {said}" in out


def test_it_exits_0_for_a_two_node_job_that_finished(site, cli):
    Node.objects.filter(pk=site["node"].pk).update(state=Node.State.DRAIN)
    site["project"].quotas.update(max_gpus=None)
    nodes = [make_node(f"cli-{name}", gpus=2) for name in ("b", "c")]
    token = token_for(site["alice"])
    blockers = [_blocker(node.gpus.all()[:1]) for node in nodes]
    waiting, job = _waiting(cli, token, "--nodes", "2", "-t", "1h", "--", "torchrun", "x.py")
    for blocker in blockers:
        booking_transition(blocker.pk, to="finished", now=timezone.now())
    allocation_pass(now=timezone.now())
    for node in nodes:
        _exit_on(node, job.pk, 0)
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err  # 8, "ended without starting", before
    assert f"Booking {job.pk} ran and finished" in out
    assert "all 2 nodes exited with code 0" in out


def test_it_keeps_waiting_for_a_requeued_job_and_exits_0_once_it_finished(site, cli):
    token = token_for(site["alice"])
    whole = Gpu.objects.filter(node=site["node"], mig_mode=False)
    blocker = _blocker(whole)
    waiting, job = _waiting(cli, token, "-g", "1", "-t", "1h", "--", "train")
    booking_transition(blocker.pk, to="finished", now=timezone.now())
    allocation_pass(now=timezone.now())
    with transaction.atomic():  # its node failed; the devices are taken again before a pass
        assert booking_stop(booking_id=job.pk, to="failed", now=timezone.now(), detail="down")
        again = _blocker(whole)
    assert "restart 1" in waiting.stderr.readline()  # seen back in the queue: waits on
    booking_transition(again.pk, to="finished", now=timezone.now())
    allocation_pass(now=timezone.now())
    _exit_on(site["node"], job.pk, 0)
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0, err
    assert f"Booking {job.pk} ran and finished" in out


def test_it_follows_a_running_bookings_output_until_it_ends(site, cli):
    token = token_for(site["alice"])
    booking = make_active_booking(
        [Gpu.objects.get(index=0)], owner=site["alice"], project=site["project"]
    )
    Booking.objects.filter(pk=booking.pk).update(log_tail="step 1\n")
    follow = cli.start("logs", "-f", "--interval", "0.2", str(booking.pk), token=token)
    assert follow.stdout.readline() == "step 1\n"
    # A tail window that moved past what was shown is printed whole; one that grew, only the rest.
    Booking.objects.filter(pk=booking.pk).update(log_tail="step 2\n")
    assert follow.stdout.readline() == "step 2\n"
    Booking.objects.filter(pk=booking.pk).update(
        log_tail="step 2\nstep 3\ndone\n", state=Booking.State.FINISHED, exit_code=0
    )
    out, _ = follow.communicate(timeout=30)
    assert follow.returncode == 0 and out == "step 3\ndone\n"


def test_it_submits_an_array_after_another_booking_and_shows_both(site, cli):
    token = token_for(site["alice"])
    first = _json(cli("submit", "--json", "-g", "1", "-t", "1h", "--", "train", token=token))
    result = cli(
        "submit", "-g", "1", "-t", "30m", "--array", "0-5%2", "--after", f"afterok:{first['id']}",
        "--", "python", "eval.py", token=token,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tasks = Booking.objects.exclude(pk=first["id"]).order_by("array_task_id")
    parent = tasks[0].pk
    assert [t.array_task_id for t in tasks] == list(range(6))
    assert _field(result.stdout, "Array") == f"task 0 of array {parent} (0-5%2)"
    assert _field(result.stdout, "After") == f"afterok:{first['id']}"
    shown = cli("show", str(tasks[3].pk), token=token).stdout
    assert _field(shown, "Pending reason") == "dependency"
    assert _field(shown, "Detail") == f"waits for afterok:{first['id']}"
    refused = cli("submit", "-g", "1", "-t", "30m", "--array", "9-1", "--", "x", token=token)
    assert refused.returncode != 0 and "array" in refused.stderr


def test_it_submits_a_command_in_a_container_image(site, cli, settings):
    settings.CONTAINER_IMAGE_SOURCES = ["docker://nvcr.io/"]
    Node.objects.filter(pk=site["node"].pk).update(container_runtimes="podman")
    token = token_for(site["alice"])
    image = "docker://nvcr.io/nvidia/pytorch:24.05-py3"
    result = cli(
        "submit", "-g", "1", "-t", "30m", "--image", image, "--", "python", "t.py", token=token
    )
    assert result.returncode == 0, result.stderr
    assert _field(result.stdout, "Image") == image
    refused = cli("submit", "-t", "1h", "--image", "docker://elsewhere/x:1", "--", "x", token=token)
    assert refused.returncode != 0 and "not from an allowed source" in refused.stderr


def _field(stdout: str, label: str) -> str:
    """The value of a 'Label:   value' line of `show`."""
    return next(
        line.split(":", 1)[1].strip()
        for line in stdout.splitlines()
        if line.startswith(f"{label}:")
    )


def test_it_lists_the_maintenance_windows_planned_or_under_way(site, cli):
    from portal.models import MaintenanceWindow

    now = timezone.now()
    soon = MaintenanceWindow.objects.create(
        reason="firmware", start=now + timedelta(hours=1), end=now + timedelta(hours=2)
    )
    soon.nodes.set([site["node"]])
    MaintenanceWindow.objects.create(
        reason="old", start=now - timedelta(hours=3), end=now - timedelta(hours=2)
    )
    token = token_for(site["alice"])
    shown = cli("maintenance", "list", "--utc", token=token)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATE", "START", "END", "NODES", "REASON"]
    assert len(lines) == 2 and "planned" in lines[1] and "cli-a" in lines[1]
    assert "firmware" in lines[1] and "old" not in shown.stdout
    every = _json(cli("maintenance", "list", "--all", "--json", token=token))
    assert [w["reason"] for w in every] == ["old", "firmware"]
    assert every[0]["all_nodes"] is True and every[0]["state"] == "over"
