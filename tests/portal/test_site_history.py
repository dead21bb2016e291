"""The site's history as the replay's trace (GET /api/v1/history/, issue 39 item 1): what it
exports, pseudonymised or not, its bad input, and the replay reading it back."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from portal.models import Booking, BookingDependency
from scheduler.replay import load_jobs, replay_trace
from tests.conftest import error_of
from tests.factories import BookingFactory, ProjectFactory, UserFactory, make_node

pytestmark = pytest.mark.django_db
State = Booking.State


@pytest.fixture
def staff_api(db):
    client = APIClient()
    client.force_authenticate(UserFactory(username="ops", is_staff=True))
    return client


def _ended(owner, project, *, submitted_h_ago: float, waited_s: float, ran_s: float, **kwargs):
    submitted = timezone.now() - timedelta(hours=submitted_h_ago)
    started = submitted + timedelta(seconds=waited_s)
    return BookingFactory(
        owner=owner,
        project=project,
        submitted_at=submitted,
        started_at=started,
        ended_at=started + timedelta(seconds=ran_s),
        state=kwargs.pop("state", State.FINISHED),
        **kwargs,
    )


@pytest.fixture
def history(db):
    """alice and bob in vision: two finished bookings (the second after the first), a failed
    one on MIG, one cancelled before it started, one still pending and one from last month."""
    make_node("gpu-a01", gpus=4)
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    vision = ProjectFactory(slug="vision")
    first = _ended(alice, vision, submitted_h_ago=5, waited_s=60, ran_s=1800, gpus=2)
    second = _ended(bob, vision, submitted_h_ago=4, waited_s=0, ran_s=600, duration_s=7200)
    BookingDependency.objects.create(booking=second, target=first, kind="afterok")
    mig = _ended(alice, vision, submitted_h_ago=3, waited_s=5, ran_s=30, state=State.FAILED)
    Booking.objects.filter(pk=mig.pk).update(gpus=0, mig_profile="1g.10gb")
    BookingFactory(
        owner=bob,
        project=vision,
        submitted_at=timezone.now() - timedelta(hours=2),
        state=State.CANCELLED,
        ended_at=timezone.now() - timedelta(hours=1),
    )
    BookingFactory(owner=bob, project=vision, state=State.PENDING)
    _ended(alice, vision, submitted_h_ago=24 * 40, waited_s=0, ran_s=60)  # before the period
    return {"first": first, "second": second, "mig": mig}


@pytest.mark.both_databases
def test_it_exports_the_ended_bookings_of_the_period_as_the_replays_trace(staff_api, history):
    body = staff_api.get("/api/v1/history/", {"days": 30}).json()
    rows = body["rows"]
    assert [row["state"] for row in rows] == ["finished", "finished", "failed", "cancelled"]
    first, second, mig, cancelled = rows
    assert first["job_id"] == str(history["first"].pk)
    assert (first["num_gpus"], first["duration_s"], first["requested_s"]) == (2, 1800.0, 3600)
    assert (second["duration_s"], second["requested_s"]) == (600.0, 7200)
    assert second["dependency"] == f"afterok:{history['first'].pk}"
    assert second["submit_time_s"] - first["submit_time_s"] == pytest.approx(3600, abs=1)
    assert (mig["num_gpus"], mig["mig_profile"]) == (0, "1g.10gb")
    assert cancelled["duration_s"] == 0.0
    assert body["inventory"] == {"A100-80GB": 4}
    # Pseudonyms: never the names, one per name, the same in the next export.
    assert body["pseudonymised"] is True
    assert {row["user"] for row in rows} == {first["user"], second["user"]}
    assert (
        first["user"] != second["user"] and "alice" not in str(body) and "vision" not in str(body)
    )
    again = staff_api.get("/api/v1/history/").json()["rows"]  # default: 30 days
    assert [(r["job_id"], r["user"], r["project"]) for r in again] == [
        (r["job_id"], r["user"], r["project"]) for r in rows
    ]
    named = staff_api.get("/api/v1/history/", {"real_names": "true"}).json()
    assert [row["user"] for row in named["rows"]][:2] == ["alice", "bob"]
    assert named["pseudonymised"] is False


@pytest.mark.both_databases
def test_it_downloads_the_trace_as_csv_and_the_replay_reads_it_back(staff_api, history, tmp_path):
    response = staff_api.get("/api/v1/history/", {"days": 30, "format": "csv"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    text = response.content.decode()
    assert len(list(csv.DictReader(io.StringIO(text)))) == 4
    path = tmp_path / "history.csv"
    path.write_text(text)
    jobs = load_jobs(str(path), project_column="project")
    # The cancelled booking never ran: left out; what the allocator was told is what was asked.
    assert [job.job_id for job in jobs] == [str(history[k].pk) for k in ("first", "second", "mig")]
    assert [job.walltime for job in jobs] == [3600.0, 7200.0, 3600.0]
    assert [(d.kind, d.booking_id) for d in jobs[1].after] == [
        ("afterok", str(history["first"].pk))
    ]
    result = replay_trace(str(path), gpus=4, gpus_per_node=4, policy="easy")
    assert result["jobs"] == 2  # the MIG booking asks no whole GPU: skipped in this replay
    assert result["skipped"] == 1


def test_it_refuses_anyone_but_staff(api, history):
    response = api.get("/api/v1/history/")
    assert response.status_code == 403
    assert error_of(response)["code"] == "forbidden"


@pytest.mark.parametrize("days", ["0", "367", "abc", "1.5"])
def test_it_refuses_a_period_out_of_range_naming_days(staff_api, history, days):
    response = staff_api.get("/api/v1/history/", {"days": days})
    assert response.status_code == 400, response.content
    assert "days" in error_of(response)["fields"]


def test_it_says_so_when_the_period_has_no_ended_booking(staff_api, db):
    BookingFactory(state=State.PENDING)
    response = staff_api.get("/api/v1/history/", {"days": 1})
    assert response.status_code == 400
    assert "nothing to replay" in error_of(response)["fields"]["days"]


def test_it_documents_the_endpoint_in_the_openapi_schema(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    names = {p["name"] for p in schema["paths"]["/api/v1/history/"]["get"]["parameters"]}
    assert names >= {"days", "real_names", "format"}


def _replay_site(*args: str) -> tuple[str, str]:
    from django.core.management import call_command

    out, err = io.StringIO(), io.StringIO()
    call_command("replay_site", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.both_databases
def test_it_replays_the_sites_history_under_every_preset_at_each_load(history, tmp_path):
    out, err = _replay_site("--days", "30", "--export", str(tmp_path / "trace.csv"))
    assert "4 bookings submitted" in out and "replayed on 4 GPUs (4 per node)" in out
    for load in ("0.75", "1", "1.25"):
        assert f"load {load} (2 jobs, 1 skipped)" in out  # the MIG booking: no whole GPU
    for name in ("current", "portal", "easy-sjbf", "conservative", "portal-predict"):
        assert f"\n{name} " in out, out
    assert out.count("dominating the current policy:") == 3
    assert "[30/30] portal-predict at load 1.25" in err  # 10 policies x 3 loads, on stderr
    assert (tmp_path / "trace.csv").read_text().startswith("job_id,user,project,")
    lines, _ = _replay_site("--presets", "portal,sjf-easy", "--loads", "1", "--json")
    rows = [json.loads(line) for line in lines.splitlines()]
    assert [(r["policy"], r["load"]) for r in rows] == [("portal", 1.0), ("sjf-easy", 1.0)]
    assert {"mean_wait_s", "p99_wait_s", "max_wait_s", "mean_bsld", "utilization"} <= set(rows[0])
    assert rows[0]["bound"] == "(k+1)W" and rows[1]["bound"] is None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--days", "0"], "--days: must be a whole number of days from 1 to 366"),
        (["--loads", "0.1"], "--loads: each load must be from 0.25 to 4"),
        (["--loads", "fast"], "--loads: 'fast' is not a list of numbers"),
        (["--presets", "nope"], "--presets: no preset named nope; choose from current, portal"),
    ],
)
def test_it_refuses_bad_input_naming_the_option(history, args, said):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=re.escape(said)):
        _replay_site(*args)
