"""Booking events reach their owner by mail (plain text and HTML), Slack and a signed webhook,
through real servers on loopback; each delivery is sent once and recorded."""

import hashlib
import hmac
import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from portal.models import (
    Delivery,
    NotificationContact,
    NotificationPreference,
    ProjectNotificationSettings,
)
from portal.services.notify.delivery import delivery_send
from portal.services.notify.notifications import booking_event_record
from tests.factories import make_active_booking, make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def started(owner, project):
    gpus = list(make_node("gpu-a", gpus=2).gpus.order_by("index"))
    return make_active_booking(gpus, owner=owner, project=project, gpus=2)


def _record(booking, event, capture):
    with capture(execute=True), transaction.atomic():
        return booking_event_record(booking_id=booking.pk, event=event)


def test_it_mails_plain_text_and_html_with_action_links_at_the_sites_address(
    smtp, started, settings, django_capture_on_commit_callbacks
):
    settings.SITE_URL = "http://portal.example.org:8123"
    _record(started, "started", django_capture_on_commit_callbacks)
    (mail,) = smtp
    assert mail["To"] == "alice@example.org"
    assert mail["Subject"] == f"Booking {started.pk} is active: 2 GPUs on gpu-a"
    text = mail.get_body(("plain",)).get_content()
    html = mail.get_body(("html",)).get_content()
    assert "export CUDA_VISIBLE_DEVICES=GPU-" in text
    assert "Extend by an hour: http://portal.example.org:8123/actions/" in text
    assert 'href="http://portal.example.org:8123/actions/' in html
    assert f"http://portal.example.org:8123/bookings/{started.pk}/" in html
    delivery = Delivery.objects.get(channel="email")
    assert (delivery.status, delivery.attempts) == ("sent", 1)
    assert mail["Message-ID"].startswith(f"<{delivery.idempotency_key}@")


def test_it_posts_a_signed_webhook(receiver, started, owner, django_capture_on_commit_callbacks):
    NotificationContact.objects.create(
        user=owner, webhook_url=f"{receiver.url}/hook", webhook_secret="s3cret"
    )
    _record(started, "started", django_capture_on_commit_callbacks)
    (post,) = receiver.posts
    expected = "sha256=" + hmac.new(b"s3cret", post["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(post["headers"]["X-GPU-Portal-Signature-256"], expected)
    body = receiver.json()
    assert body["event"] == "started"
    assert body["booking"] == {"id": started.pk, "state": "active", "owner": "alice"}
    assert set(body["actions"]) == {"extend", "release"}
    assert post["headers"]["X-GPU-Portal-Delivery"] == body["delivery"]


def test_it_messages_the_owner_on_slack_with_block_kit_buttons(
    receiver, started, owner, settings, django_capture_on_commit_callbacks
):
    settings.SLACK_BOT_TOKEN = "xoxb-test"
    settings.SLACK_API_URL = receiver.url
    receiver.answer = b'{"ok": true}'
    NotificationContact.objects.create(user=owner, slack_user_id="U024BE7LH")
    _record(started, "started", django_capture_on_commit_callbacks)
    (post,) = receiver.posts
    assert post["path"] == "/chat.postMessage"
    assert post["headers"]["Authorization"] == "Bearer xoxb-test"
    body = receiver.json()
    assert body["channel"] == "U024BE7LH"
    (actions,) = [b for b in body["blocks"] if b["type"] == "actions"]
    assert [e["action_id"] for e in actions["elements"]] == ["extend", "release", "open"]
    assert body["blocks"][0] == {
        "type": "header",
        "text": {"type": "plain_text", "text": f"Booking {started.pk} is active: 2 GPUs on gpu-a"},
    }


def test_it_posts_to_the_projects_channel_for_the_events_it_takes(
    receiver, started, project, django_capture_on_commit_callbacks
):
    ProjectNotificationSettings.objects.create(
        project=project, slack_webhook_url=f"{receiver.url}/channel", channel_events=["failed"]
    )
    _record(started, "started", django_capture_on_commit_callbacks)
    assert receiver.posts == []
    _record(started, "failed", django_capture_on_commit_callbacks)
    assert [p["path"] for p in receiver.posts] == ["/channel"]
    assert receiver.json()["text"].startswith(f"Booking {started.pk} failed")
    _record(started, "started", django_capture_on_commit_callbacks)
    ProjectNotificationSettings.objects.update(channel_events=["started"])
    _record(started, "started", django_capture_on_commit_callbacks)
    (actions,) = [b for b in receiver.json(1)["blocks"] if b["type"] == "actions"]
    # Everyone in the channel reads it: no buttons that act as the owner, only the link.
    assert [e["action_id"] for e in actions["elements"]] == ["open"]


def test_it_keeps_mailing_when_slack_is_down(
    smtp, started, owner, settings, django_capture_on_commit_callbacks
):
    NotificationContact.objects.create(user=owner, slack_webhook_url="http://127.0.0.1:9/refused")
    settings.NOTIFY_MAX_ATTEMPTS = 2
    _record(started, "failed", django_capture_on_commit_callbacks)
    assert len(smtp) == 1
    slack = Delivery.objects.get(channel="slack")
    assert (slack.status, slack.attempts) == ("retrying", 1)
    assert "127.0.0.1:9" in slack.last_error
    _scan(django_capture_on_commit_callbacks, minutes=5)
    slack.refresh_from_db()
    assert (slack.status, slack.attempts) == ("failed", 2)
    assert len(smtp) == 1


def _scan(capture, *, minutes: float):
    from portal.services.notify.notify_scan import notifications_scan

    with capture(execute=True):
        notifications_scan(now=timezone.now() + timedelta(minutes=minutes))


def test_it_delivers_once_after_a_server_error_when_its_backoff_is_over(
    receiver, started, owner, settings, django_capture_on_commit_callbacks
):
    settings.NOTIFY_RETRY_BACKOFF_S = 60
    NotificationContact.objects.create(user=owner, webhook_url=f"{receiver.url}/hook")
    receiver.fail_first = 1
    _record(started, "started", django_capture_on_commit_callbacks)
    assert Delivery.objects.get(channel="webhook").status == "retrying"
    _scan(django_capture_on_commit_callbacks, minutes=0.5)  # too early
    assert receiver.posts == []
    _scan(django_capture_on_commit_callbacks, minutes=2)
    _scan(django_capture_on_commit_callbacks, minutes=3)
    assert len(receiver.posts) == 1
    delivery = Delivery.objects.get(channel="webhook")
    assert (delivery.status, delivery.attempts) == ("sent", 2)


def test_it_sends_a_delivery_once_however_often_its_task_runs(smtp, started):
    with transaction.atomic():
        booking_event_record(booking_id=started.pk, event="started")
    delivery = Delivery.objects.get(channel="email")
    for _ in range(3):
        delivery_send(delivery_id=delivery.pk, now=timezone.now())
    assert len(smtp) == 1


def test_it_follows_the_users_choice_over_the_projects_and_the_sites(smtp, started, owner, project):
    ProjectNotificationSettings.objects.create(
        project=project, default_channels={"started": [], "extended": ["email"]}
    )
    with transaction.atomic():
        booking_event_record(booking_id=started.pk, event="started")
        booking_event_record(booking_id=started.pk, event="extended")
        booking_event_record(booking_id=started.pk, event="failed")  # the site's default
    assert sorted(Delivery.objects.values_list("event", flat=True)) == ["extended", "failed"]
    NotificationPreference.objects.create(
        user=owner, event="started", channel="email", enabled=True
    )
    with transaction.atomic():
        booking_event_record(booking_id=started.pk, event="started")
    assert Delivery.objects.filter(event="started").count() == 1


def test_it_words_an_ended_booking_with_its_usage(smtp, started, settings):
    from portal.models import Notification
    from portal.services.notify.messages import message_build
    from tests.factories import SampleFactory

    for a in started.allocations.all():
        SampleFactory(
            node=a.gpu.node, uuid=a.gpu.uuid, time=a.start, utilization_gpu=40, power_w=300
        )
    with transaction.atomic():
        booking_event_record(booking_id=started.pk, event="released")
    message = message_build(Notification.objects.get(event="ended"))
    facts = dict(message.facts)
    assert facts["Mean utilization"] == "40 %"
    assert json.dumps(facts)  # plain strings throughout


def test_it_words_a_failed_command_with_its_exit_code_and_log_tail(
    smtp, started, django_capture_on_commit_callbacks
):
    from portal.models import Booking

    log = "\n".join(f"step {i}" for i in range(40)) + "\nCUDA error: out of memory"
    Booking.objects.filter(pk=started.pk).update(
        state="failed", exit_code=1, log_tail=log, state_detail="command exited with code 1"
    )
    _record(started, "failed", django_capture_on_commit_callbacks)
    (mail,) = smtp
    text = mail.get_body(("plain",)).get_content().replace("\r\n", "\n")
    assert mail["Subject"] == f"Booking {started.pk} failed: command exited with code 1"
    assert "Exit code: 1" in text
    # The last 20 lines of the log: step 21 to 39 and the error.
    assert "step 21\nstep 22" in text and "CUDA error: out of memory" in text
    assert "step 20\n" not in text


def test_it_posts_to_a_projects_channel_by_name_through_the_bot(
    receiver, started, project, settings, django_capture_on_commit_callbacks
):
    settings.SLACK_BOT_TOKEN = "xoxb-test"
    settings.SLACK_API_URL = receiver.url
    receiver.answer = b'{"ok": false, "error": "channel_not_found"}'
    ProjectNotificationSettings.objects.create(
        project=project, slack_channel="#vision-gpus", channel_events=["started"]
    )
    _record(started, "started", django_capture_on_commit_callbacks)
    assert receiver.json()["channel"] == "#vision-gpus"
    delivery = Delivery.objects.get(channel="slack")
    # Slack said no for a reason trying again will not fix: failed at once, with Slack's words.
    assert (delivery.status, delivery.last_error) == ("failed", "slack: channel_not_found")


def test_it_records_a_booking_event_in_a_few_queries(started, django_assert_max_num_queries):
    # Recorded inside the allocator's start transactions: it must stay cheap.
    NotificationContact.objects.create(user=started.owner, webhook_url="https://example.org/h")
    with transaction.atomic(), django_assert_max_num_queries(6):
        assert booking_event_record(booking_id=started.pk, event="started") == 2


EVIL_LOG = (
    "training...\n```\n<!channel> your session expired, "
    "<http://evil.example/login|Extend by an hour>\n&amp; more"
)


def test_it_keeps_a_log_tail_inside_its_slack_code_block_and_mentions_nobody(
    receiver, started, project, django_capture_on_commit_callbacks
):
    from portal.models import Booking

    Booking.objects.filter(pk=started.pk).update(
        state="failed", exit_code=1, log_tail=EVIL_LOG, state_detail="<!here> exited <@U1>"
    )
    ProjectNotificationSettings.objects.create(
        project=project, slack_webhook_url=f"{receiver.url}/channel", channel_events=["failed"]
    )
    _record(started, "failed", django_capture_on_commit_callbacks)
    payload = receiver.json()
    texts = [payload["text"]] + [
        t["text"]
        for block in payload["blocks"]
        for t in [block.get("text") or {}, *block.get("fields", [])]
        if t.get("type") == "mrkdwn"
    ]
    every = "\n".join(texts)
    # No mention, no link of Slack's syntax: only escaped text.
    assert "<!channel>" not in every and "<!here>" not in every and "<@U1>" not in every
    assert "<http" not in every and "&lt;!channel&gt;" in every
    assert "&amp;amp; more" in every  # the log's own "&amp;" shows as typed
    (code,) = [t for t in texts if "```" in t]
    assert code.count("```") == 2 and code.endswith("```")  # opened once, closed at the end
    buttons = [e for b in payload["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert [b["text"]["text"] for b in buttons] == ["Open in the portal"]


def test_it_escapes_a_node_alerts_detail_and_a_gpu_model_in_slack():
    from portal.services.notify.messages import Message, slack_payload

    message = Message(
        "GPU alert", "pid 7 <!channel> on <http://x|y>", facts=[("Devices", "A100 <!everyone>")]
    )
    payload = slack_payload(message)
    assert payload["blocks"][1]["text"]["text"] == "pid 7 &lt;!channel&gt; on &lt;http://x|y&gt;"
    assert payload["blocks"][2]["fields"][0]["text"] == "*Devices*\nA100 &lt;!everyone&gt;"


def _slack_texts(payload: dict) -> list[tuple[str, str]]:
    """(kind, text) of every section text and field of a Block Kit payload."""
    return [
        (kind, t["text"])
        for block in payload["blocks"]
        if block["type"] == "section"
        for kind, t in [
            ("text", block.get("text")),
            *[("field", f) for f in block.get("fields", [])],
        ]
        if t
    ]


def _unescape_code(text: str) -> str:
    text = text.replace("`\u200b", "`")
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


LINE = "step <x> & `y` loss=0.1 🔥 " * 8  # escapes to more than twice its length


@pytest.mark.parametrize(
    ("block", "cut"),
    [
        ("short log", 0),
        ("x" * 2950, 0),  # fits with the title and both fences
        ("\n".join(f"{i} {LINE}" for i in range(20)), None),  # a failed job's last 20 lines
        ("<" * 16_000, None),  # 64,000 characters once escaped
        ("`" * 16_000, None),
        ("&amp;" * 3200, None),
    ],
)
def test_it_cuts_a_slack_code_block_to_its_limit_after_escaping(block, cut):
    from portal.services.notify.messages import Message, slack_payload

    message = Message(
        "Booking 1 failed",
        "Your booking failed.",
        facts=[("Reason", "<!here> " * 1000)],
        block=block,
        block_title="Last lines of the log",
    )
    texts = _slack_texts(slack_payload(message))
    for kind, text in texts:
        assert len(text.encode("utf-16-le")) // 2 <= (3000 if kind == "text" else 2000), kind
    (code,) = [text for _, text in texts if "```" in text]
    assert code.startswith("*Last lines of the log*\n```") and code.endswith("```")
    inner = code.removeprefix("*Last lines of the log*\n```").removesuffix("```")
    assert "```" not in inner
    if cut == 0:
        assert _unescape_code(inner) == block
        return
    marker, _, tail = inner.partition("\n")
    left_out = int(marker.removeprefix("… (truncated, ").removesuffix(" characters)"))
    assert left_out > 0 and block.endswith(_unescape_code(tail))
    assert left_out + len(_unescape_code(tail)) == len(block)
    # Nearly all the room is used: cut for the limit, not far short of it.
    assert len(code.encode("utf-16-le")) // 2 > 3000 - 40
    (reason,) = [text for kind, text in texts if kind == "field"]
    assert reason.startswith("*Reason*\n&lt;!here&gt; ") and "(truncated, " in reason


def test_it_posts_a_failed_jobs_long_log_to_slack_within_its_limits(
    receiver, started, project, django_capture_on_commit_callbacks
):
    from portal.models import Booking

    log = "\n".join(f"{i} {LINE}" for i in range(40))
    Booking.objects.filter(pk=started.pk).update(
        state="failed", exit_code=1, log_tail=log, state_detail="command exited with code 1"
    )
    ProjectNotificationSettings.objects.create(
        project=project, slack_webhook_url=f"{receiver.url}/channel", channel_events=["failed"]
    )
    _record(started, "failed", django_capture_on_commit_callbacks)
    texts = _slack_texts(receiver.json())
    assert max(len(text.encode("utf-16-le")) // 2 for _, text in texts) <= 3000
    (code,) = [text for _, text in texts if "```" in text]
    assert "(truncated, " in code and code.endswith("39 " + _code(LINE) + "```")
    assert Delivery.objects.get(channel="slack").status == "sent"


def _code(text: str) -> str:
    from portal.services.notify.messages import slack_text

    return slack_text(text).replace("`", "`\u200b")


def test_it_mails_about_a_gpu_whose_stored_model_has_a_line_break(
    smtp, started, django_capture_on_commit_callbacks
):
    from portal.models import Gpu

    # Stored before the protocol refused control characters in names.
    Gpu.objects.filter(node__hostname="gpu-a").update(model="H100\r\nBcc: all@example.org")
    Booking = type(started)
    Booking.objects.filter(pk=started.pk).update(state="failed", state_detail="x\r\ny")
    _record(started, "failed", django_capture_on_commit_callbacks)
    (mail,) = smtp
    assert "\n" not in mail["Subject"] and mail["Bcc"] is None
    assert Delivery.objects.get(channel="email").status == "sent"


def test_it_says_a_command_that_exited_ended_the_booking_not_its_end_time(
    smtp, started, django_capture_on_commit_callbacks
):
    from portal.models import Booking

    Booking.objects.filter(pk=started.pk).update(
        state="finished",
        command="python train.py",
        exit_code=0,
        state_detail="command exited with code 0",
    )
    _record(started, "finished", django_capture_on_commit_callbacks)
    (mail,) = smtp
    text = mail.get_body(("plain",)).get_content()
    assert "Your booking ended: its command exited with code 0." in text
    assert "reached its end time" not in text
