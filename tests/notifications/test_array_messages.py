"""A job array is told as one, on every channel: submitted with its tasks, its first task
started, all ended with counts; a task at a time only when its owner asks; a cancel of the
whole array in one digest. Real mail (SMTP on loopback) and Slack (a webhook on loopback)."""

import json

import pytest
from django.db import transaction
from django.utils import timezone

from portal.models import Booking, NotificationContact
from portal.services.booking import events
from portal.services.booking.bookings import booking_transition
from portal.services.notify.array_messages import array_counts
from portal.services.notify.notify_scan import notifications_scan

pytestmark = pytest.mark.django_db
State = Booking.State


@pytest.fixture
def commits(django_capture_on_commit_callbacks):
    return lambda: django_capture_on_commit_callbacks(execute=True)


def _submit(api, commits, tasks: str) -> int:
    with commits():
        response = api.post(
            "/api/v1/bookings/",
            {"gpus": 1, "duration_s": 600, "command": "python sweep.py", "array": tasks},
            format="json",
        )
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _fail(booking_id: int, commits) -> None:
    # What the agent's report of a non-zero exit does.
    with commits(), transaction.atomic():
        booking_transition(booking_id, to=State.FAILED, now=timezone.now(), detail="exit 1")
        events.booking_changed(Booking(pk=booking_id), "failed")


def _slack_subjects(receiver) -> list[str]:
    return [json.loads(post["body"])["text"] for post in receiver.posts]


def test_it_tells_a_ten_task_array_in_three_messages_on_mail_and_slack(
    api, user, project, cluster, commits, smtp, receiver
):
    NotificationContact.objects.create(user=user, slack_webhook_url=f"{receiver.url}/me")
    array = _submit(api, commits, "0-9%4")  # four at a time: six wait in the queue
    tasks = Booking.objects.filter(array_parent_id=array)
    assert tasks.filter(state=State.ACTIVE).count() == 4
    assert tasks.filter(state=State.PENDING, planned_start__isnull=False).count() == 6
    with commits():  # the queued tasks are planned; the running ones end within the lead
        notifications_scan(now=timezone.now())
    with commits():
        waiting = tasks.filter(state=State.PENDING).first()
        assert api.post(f"/api/v1/bookings/{waiting.pk}/cancel/").status_code == 200
    _fail(tasks.filter(state=State.ACTIVE).first().pk, commits)
    while tasks.filter(state=State.ACTIVE).exists():  # each end lets the next task start
        for task in tasks.filter(state=State.ACTIVE):
            with commits():
                assert api.post(f"/api/v1/bookings/{task.pk}/release/").status_code == 200
    subjects = [m["Subject"] for m in smtp]
    assert subjects == [
        f"Array {array} submitted: 10 tasks",
        f"Array {array}: its first task started",
        f"Array {array} ended: 8 finished, 1 failed, 1 cancelled",
    ]
    assert _slack_subjects(receiver) == subjects  # Slack is grouped as mail is
    text = smtp[-1].get_body(("plain",)).get_content()
    assert "All 10 tasks of your array have ended: 8 finished, 1 failed, 1 cancelled." in text


def test_it_tells_each_task_when_its_owner_asks(api, user, project, cluster, commits, smtp):
    response = api.put("/api/v1/me/notifications/", {"array_each_task": True}, format="json")
    assert response.status_code == 200 and response.json()["array_each_task"] is True
    array = _submit(api, commits, "0-9")
    started = [m["Subject"] for m in smtp if " is active: " in m["Subject"]]
    assert len(started) == 10
    task = Booking.objects.get(array_parent_id=array, array_task_id=4)
    with commits():
        api.post(f"/api/v1/bookings/{task.pk}/release/")
    assert smtp[-1]["Subject"].startswith(f"Booking {task.pk} ended")


def test_it_tells_a_cancel_of_a_300_task_array_in_one_digest(
    api, user, project, cluster, commits, smtp, receiver
):
    # Even for an owner who hears of each task: one command, one message.
    NotificationContact.objects.create(
        user=user, slack_webhook_url=f"{receiver.url}/me", array_each_task=True
    )
    array = _submit(api, commits, "0-299")
    mails, posts = len(smtp), len(receiver.posts)
    with commits():
        response = api.post(f"/api/v1/bookings/{array}/cancel-array/")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["array"] == array and len(body["cancelled"]) == 300
    assert body["states"] == {"cancelled": 300}
    assert set(Booking.objects.filter(array_parent_id=array).values_list("state", flat=True)) == {
        State.CANCELLED
    }
    digest = f"Array {array} ended: 0 finished, 0 failed, 300 cancelled"
    assert [m["Subject"] for m in smtp[mails:]] == [digest]
    assert _slack_subjects(receiver)[posts:] == [digest]
    assert "You cancelled the array: all 300 tasks have ended" in (
        smtp[-1].get_body(("plain",)).get_content()
    )


@pytest.mark.parametrize(
    ("states", "said"),
    [
        ({"finished": 10}, "10 finished, 0 failed, 0 cancelled"),
        (
            {"finished": 1, "failed": 2, "expired": 1},
            "1 finished, 2 failed, 0 cancelled, 1 expired",
        ),
        ({"cancelled": 3, "preempted": 1}, "0 finished, 0 failed, 3 cancelled, 1 preempted"),
    ],
)
def test_it_counts_finished_failed_and_cancelled_always_and_other_ends_where_any(states, said):
    assert array_counts(states) == said
