"""The client's parsing and formatting, without a portal."""

from datetime import UTC, datetime

import pytest

from portal.cli import output
from portal.cli.client import api_error
from portal.cli.commands import _command, _new_part, estimate
from portal.cli.main import build_parser, main


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90m", 5400),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86400),
        ("45s", 45),
        ("30", 1800),  # a bare number is minutes, as Slurm's --time reads it
        ("01:30:00", 5400),
        ("1-02:00:00", 93600),
        ("05:30", 330),
    ],
)
def test_it_reads_durations_as_slurm_users_write_them(text, seconds):
    assert output.parse_duration(text) == seconds


def test_it_refuses_a_duration_it_cannot_read():
    with pytest.raises(ValueError, match="'soon' is not a duration"):
        output.parse_duration("soon")


@pytest.mark.parametrize("text", ["١٢", "١h", "٠١:٣٠:٠٠", "2h٣٠m"])
def test_it_reads_durations_of_ascii_digits_only(text):
    with pytest.raises(ValueError, match="is not a duration"):
        output.parse_duration(text)


@pytest.mark.parametrize(
    ("text", "said"),
    [("9" * 40, "at most 32 characters"), ("99999999999d", "longer than any booking")],
)
def test_it_refuses_a_duration_past_its_bounds(text, said):
    with pytest.raises(ValueError, match=said):
        output.parse_duration(text)


def test_it_aligns_tables_and_shows_missing_values_as_dashes():
    text = output.table(["ID", "STATE", "REASON"], [[1, "active", None], [12, "pending", "quota"]])
    assert text.splitlines() == [
        "ID  STATE    REASON",
        "1   active   -",
        "12  pending  quota",
    ]


def test_it_shows_every_date_in_full_this_year_or_not(monkeypatch):
    monkeypatch.setattr(output, "USE_UTC", True)
    assert output.when("2026-12-03T08:05:00Z") == "2026-12-03 08:05 UTC"
    assert output.when("2027-01-03T09:00:00+01:00") == "2027-01-03 08:00 UTC"
    assert output.when(None) is None
    monkeypatch.setattr(output, "USE_UTC", False)
    assert output.when("2026-12-03T08:05:00Z") == datetime(
        2026, 12, 3, 8, 5, tzinfo=UTC
    ).astimezone().strftime("%Y-%m-%d %H:%M")


def test_it_joins_a_command_of_several_words_shell_quoted():
    assert _command(["python train.py --lr 0.1"]) == "python train.py --lr 0.1"
    assert _command(["--", "python", "train.py", "--name", "a b"]) == "python train.py --name 'a b'"
    assert _command([]) == ""


def test_it_prints_only_what_a_moved_log_tail_adds():
    assert _new_part("a\nb\n", "a\nb\nc\n") == "c\n"
    assert _new_part("a\nb\nc\n", "b\nc\nd\n") == "d\n"
    assert _new_part("x\n", "y\n") == "y\n"


def test_it_maps_the_api_error_shape_to_exit_codes():
    body = b'{"error": {"code": "quota_exceeded", "message": "Quota max_gpus.", "fields": {}}}'
    error = api_error(409, body)
    assert (error.exit_code, error.code, error.message) == (5, "quota_exceeded", "Quota max_gpus.")
    assert api_error(404, b'{"error": {"code": "not_found", "message": "No."}}').exit_code == 4
    assert api_error(401, b"{}").exit_code == 3
    assert api_error(502, b"<html>bad gateway</html>").message.startswith("HTTP 502")


class _Answering:
    """Stands in for the client where the portal's answer is the input under test."""

    def __init__(self, answer: dict):
        self.answer = answer

    def post(self, path, body=None, headers=None):
        return self.answer


@pytest.mark.parametrize(
    "answer",
    [
        {"earliest_start": None, "reason": "quota", "detail": "over max_gpus", "queue_position": 3},
        {"planned_start": None, "pending_reason": "quota", "state_detail": "over max_gpus",
         "queue_position": 3},
    ],
)  # fmt: skip
def test_it_reads_the_estimate_under_its_old_and_its_booking_field_names(answer, capsys):
    args = build_parser().parse_args(["estimate", "-g", "1", "-t", "1h"])
    assert estimate(_Answering(answer), args) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Earliest start:  not possible now",
        "Reason:          quota",
        "Queue position:  3",
        "Detail:          over max_gpus",
    ]


def test_it_asks_which_portal_when_none_is_configured(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("GPU_PORTAL_URL", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert main(["login", "-u", "alice", "--password-stdin"]) == 2
    assert "Which portal? Pass --url" in capsys.readouterr().err


def test_it_reports_a_broken_config_file_as_a_usage_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "gpu-portal").mkdir()
    (tmp_path / "gpu-portal" / "config.json").write_text("{not json")
    assert main(["list"]) == 2
    assert "config.json is not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["submit", "-g", "١"], ["submit", "-N", "٢"], ["show", "٤٢"]])
def test_it_reads_counts_and_ids_of_ascii_digits_only(args, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(args)
    assert stopped.value.code == 2
    assert "is not a whole number (digits 0-9)" in capsys.readouterr().err
