"""`gpu-portal submit --jupyter` and `gpu-portal open ID` against a live portal."""

import json
import re
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.models import Booking
from tests.cli.conftest import ROOT, token_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_submits_a_jupyterlab_session_and_says_how_to_open_it(site, cli):
    token = token_for(site["alice"])
    result = cli("submit", "--jupyter", "-g", "1", "-t", "1h", token=token)

    assert result.returncode == 0, result.stderr
    booking = Booking.objects.get()
    assert booking.interactive == "jupyterlab" and booking.command == ""
    assert f"gpu-portal open {booking.pk}" in result.stderr
    terminal = cli("submit", "--terminal", "-g", "1", "-t", "1h", token=token)
    assert terminal.returncode == 0, terminal.stderr
    assert Booking.objects.order_by("-id").first().interactive == "terminal"


def test_it_refuses_a_session_with_a_command_as_a_usage_error(site, cli):
    token = token_for(site["alice"])
    result = cli("submit", "--jupyter", "-t", "1h", "--", "python", "train.py", token=token)

    assert result.returncode == 2
    assert "--jupyter and --terminal run no command" in result.stderr
    assert not Booking.objects.exists()


def test_it_waits_for_the_session_then_prints_its_portal_address(site, cli):
    token = token_for(site["alice"])
    assert cli("submit", "--jupyter", "-g", "1", "-t", "1h", token=token).returncode == 0
    booking = Booking.objects.get()
    assert booking.state == "active"
    # The node reports the server ready a moment later.
    timer = threading.Timer(
        1.0, lambda: Booking.objects.filter(pk=booking.pk).update(session_state="running")
    )
    timer.start()
    try:
        result = cli("open", "--print", "--interval", "0.2", str(booking.pk), token=token)
    finally:
        timer.cancel()

    assert result.returncode == 0, result.stderr
    assert f"booking {booking.pk}: session starting" in result.stderr
    assert result.stdout.strip().endswith(f"/sessions/{booking.pk}/lab")
    assert result.stdout.startswith("http://")
    as_json = json.loads(cli("open", "--json", "--print", str(booking.pk), token=token).stdout)
    assert as_json["session"]["state"] == "running"


def test_it_says_why_a_booking_cannot_be_opened(site, cli):
    token = token_for(site["alice"])
    assert cli("submit", "-g", "1", "-t", "1h", "--", "sleep", "1", token=token).returncode == 0
    batch = Booking.objects.get()
    no_session = cli("open", "--print", str(batch.pk), token=token)
    assert no_session.returncode == 1 and "has no interactive session" in no_session.stderr

    assert cli("submit", "--jupyter", "-g", "1", "-t", "1h", token=token).returncode == 0
    session = Booking.objects.get(interactive="jupyterlab")
    Booking.objects.filter(pk=session.pk).update(
        session_state="failed", session_detail="exit code 1: no module named jupyterlab"
    )
    failed = cli("open", "--print", str(session.pk), token=token)
    assert failed.returncode == 1 and "session is failed: exit code 1" in failed.stderr
    Booking.objects.filter(pk=session.pk).update(session_state="")
    slow = cli(
        "open",
        "--print",
        "--wait-timeout",
        "0.5",
        "--interval",
        "0.2",
        str(session.pk),
        token=token,
    )
    assert slow.returncode == 7 and "not running after 0.5 s" in slow.stderr


def test_it_exits_quietly_when_its_output_is_closed(site, cli):
    token = token_for(site["alice"])
    for _ in range(3):
        assert cli("submit", "-g", "1", "-t", "1h", token=token).returncode == 0
    process = cli.start("queue", token=token)
    process.stdout.close()  # like `| head -0`: the reader is gone before the table is written
    _, err = process.communicate(timeout=30)

    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert err == ""
    assert process.returncode == 141


def test_it_prints_the_quota_refusal_as_docs_cli_md_shows_it(site, cli):
    shown = re.search(r"`(gpu-portal: Quota [^`]*)`", (ROOT / "docs" / "cli.md").read_text())
    token = token_for(site["alice"])
    start = (timezone.now() + timedelta(days=1)).replace(microsecond=0).isoformat()
    end = (timezone.now() + timedelta(days=1, hours=1)).replace(microsecond=0).isoformat()
    assert cli("submit", "-g", "2", "--start", start, "--end", end, token=token).returncode == 0
    refused = cli("submit", "-g", "2", "--start", start, "--end", end, token=token)

    assert refused.returncode == 5
    assert refused.stderr.strip() == shown.group(1)
