"""Borrowed bookings in the portal: the pass starts one past its quota's limit, and the API, the
pages, the mail, accounting, /metrics and the quota admin say so."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from portal.admin_quota import QuotaForm
from portal.cli.commands import _booking_table, _show_or_json
from portal.models import Booking, Notification
from portal.services.notify.messages import message_build
from portal.services.reporting.accounting import accounting_report, report_totals

pytestmark = pytest.mark.django_db
PAST = "project vision and user alice@vision"


@pytest.fixture
def borrowed(api, project, cluster, django_capture_on_commit_callbacks):
    """Vision may hold 2 GPUs and lends (its quota says so): alice holds 2, then asks for 2 more
    (a request wider than the limit itself is refused at submission)."""
    project.quotas.update(max_gpus=2, borrowing=True)
    ids = []
    for gpus in (2, 2):
        with django_capture_on_commit_callbacks(execute=True):
            response = api.post(
                "/api/v1/bookings/", {"gpus": gpus, "duration_s": 3600}, format="json"
            )
        assert response.status_code == 201, response.json()
        ids.append(response.json()["id"])
    within, lent = Booking.objects.get(pk=ids[0]), Booking.objects.get(pk=ids[1])
    assert within.state == lent.state == "active"
    return lent


@pytest.mark.both_databases
def test_it_shows_a_borrowed_run_in_the_api(api, borrowed):
    one = api.get(f"/api/v1/bookings/{borrowed.pk}/").json()
    # alice has no limit of her own: she has the project's, and borrows past both.
    assert one["borrowed"] is True and one["borrowed_past"] == PAST
    assert one["preemptible"] is True  # a borrowed run always is
    assert one["state_detail"] == f"borrowed past the {PAST} quota"
    listed = {b["id"]: b for b in api.get("/api/v1/bookings/").json()["results"]}
    assert listed[borrowed.pk]["borrowed"] is True
    assert [b["borrowed"] for i, b in listed.items() if i != borrowed.pk] == [False]


@pytest.mark.both_databases
def test_it_counts_no_borrowed_run_against_the_limit(
    api, borrowed, django_capture_on_commit_callbacks
):
    # Vision's guaranteed 2 GPUs are held by the run within them; the borrowed 2 count nowhere.
    quota = api.get("/api/v1/me/quota/").json()
    (row,) = (
        [r for r in quota["results"] if r["project"] == "vision"]
        if "results" in quota
        else [r for r in quota if r["project"] == "vision"]
    )
    assert row["limits"]["borrowing"] is True and row["limits"]["max_borrow_gpus"] is None
    assert row["project_usage"]["gpus_in_use"] == 2


def test_it_says_borrowed_on_the_booking_page_and_the_list(client, user, borrowed):
    client.force_login(user)
    page = client.get(f"/bookings/{borrowed.pk}/").content.decode()
    assert f"borrowed</span> past the {PAST} quota (preemptible)" in page
    assert ">borrowed</span>" in client.get("/bookings/").content.decode()


def test_it_says_borrowed_in_the_started_mail(borrowed):
    message = message_build(Notification(event="started", booking=borrowed, context={}))
    assert message.subject.startswith(f"Booking {borrowed.pk} is active (borrowed)")
    assert "may be preempted (and requeued)" in message.intro
    assert ("Borrowed", f"yes, past the {PAST} quota") in message.facts


def test_it_says_borrowed_in_the_cli(api, borrowed, capsys):
    body = api.get(f"/api/v1/bookings/{borrowed.pk}/").json()
    assert "active (borrowed)" in _booking_table([body], ["ID", "STATE"])

    class Args:
        json = False

    _show_or_json(body, Args())
    assert f"yes, past the {PAST} limit (preemptible)" in capsys.readouterr().out


def test_it_splits_borrowed_gpu_hours_in_accounting_and_metrics(borrowed):
    now = timezone.now() + timedelta(minutes=30)
    rows = accounting_report(since=now - timedelta(hours=1), until=now, group_by="project", now=now)
    (vision,) = rows
    assert vision["gpu_hours"] == pytest.approx(2.0, abs=0.01)  # 4 GPUs for half an hour
    assert vision["borrowed_gpu_hours"] == pytest.approx(1.0, abs=0.01)  # 2 of them borrowed
    assert report_totals(rows)["borrowed_gpu_hours"] == vision["borrowed_gpu_hours"]
    text = Client().get("/metrics", REMOTE_ADDR="127.0.0.1").content.decode()
    (family,) = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "gpu_portal_held_gpu_equivalents"
    ]
    held = {(s.labels["project"], s.labels["borrowed"]): s.value for s in family.samples}
    assert held == {("vision", "false"): 2.0, ("vision", "true"): 2.0}


@pytest.mark.parametrize(
    ("value", "valid"), [("-1", False), ("0", True), ("2.5", True), ("", True)]
)
def test_it_refuses_a_negative_max_borrow_gpus_in_the_admin(project, value, valid):
    quota = project.quotas.get()
    data = {"project": project.pk, "max_borrow_gpus": value, "borrowing": "true"}
    form = QuotaForm(data=data, instance=quota)
    assert form.is_valid() is valid, form.errors
    if not valid:
        assert list(form.errors) == ["max_borrow_gpus"]
        assert "greater than or equal to 0" in form.errors["max_borrow_gpus"][0]
