"""What each notification says: one Message per event, then its email, Slack and webhook forms.

All user-facing notification text lives here. A message is built when it is sent (after
commit), so it reads the booking as it is then, and its action links are fresh.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import Avg, Max
from django.template.loader import render_to_string
from django.utils.dateparse import parse_datetime

from portal.models import Allocation, Booking, Event, NodeAlert, Notification, Sample
from portal.services.notify.booking_links import ACTIONS, action_token, action_url


@dataclass
class Message:
    """A notification in words: subject, one sentence, facts, a block of text, actions, a link."""

    subject: str
    intro: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    block: str = ""
    block_title: str = ""
    actions: list[str] = field(default_factory=list)
    link: str = ""
    booking: Booking | None = None


def _when(moment) -> str:
    if isinstance(moment, str):
        moment = parse_datetime(moment)
    return f"{moment:%Y-%m-%d %H:%M} UTC" if moment else "not yet planned"


def message_build(notification: Notification) -> Message:
    """The message for a notification (the booking read as it is now)."""
    booking = notification.booking
    if booking is None:
        return _admin_message(notification)
    booking = Booking.objects.select_related("owner", "project").get(pk=booking.pk)
    context = notification.context or {}
    if "array" in context:  # a job array told as one, named by its first task
        from portal.services.notify.array_messages import array_message  # it uses Message

        message, what = array_message(booking, context["array"]), "Array"
    else:
        message, what = _BUILDERS[notification.event](booking, context), "Booking"
    message.booking = booking
    message.link = f"{settings.SITE_URL}/bookings/{booking.pk}/"
    message.facts.insert(0, (what, f"{booking.pk} · {booking.describe_request()}"))
    message.facts.insert(1, ("Project", booking.project.slug))
    return message


def _end_of(booking: Booking) -> datetime | None:
    return Allocation.objects.filter(booking=booking, live=True).aggregate(end=Max("end"))["end"]


def _queued(b: Booking, ctx: dict) -> Message:
    if b.is_reservation:
        return Message(
            f"Booking {b.pk} reserved from {_when(b.start)}",
            f"Your reservation is placed: {b.describe_request()} from {_when(b.start)} "
            f"to {_when(b.end)}.",
            actions=["cancel"],
        )
    return Message(
        f"Booking {b.pk} queued: position {b.queue_position or '?'}",
        f"Your request for {b.describe_request()} is in the queue at position "
        f"{b.queue_position or '?'}; planned start {_when(ctx.get('planned_start'))}.",
        facts=[("Why it waits", b.state_detail or b.pending_reason or "-")],
        actions=["cancel"],
    )


def _moved(b: Booking, ctx: dict) -> Message:
    return Message(
        f"Booking {b.pk}: planned start now {_when(ctx.get('planned_start'))}",
        f"The planned start of your request moved from {_when(ctx.get('previous'))} to "
        f"{_when(ctx.get('planned_start'))} (queue position {b.queue_position or '?'}).",
        facts=[("Why it waits", b.state_detail or b.pending_reason or "-")],
        actions=["cancel"],
    )


def _starting_soon(b: Booking, ctx: dict) -> Message:
    return Message(
        f"Booking {b.pk} starts at {_when(b.start)}",
        f"Your reservation of {b.describe_request()} starts at {_when(b.start)}.",
        actions=["cancel"],
    )


def _devices(b: Booking) -> list[Allocation]:
    return list(
        Allocation.objects.filter(booking=b)
        .select_related("gpu__node", "mig_instance")
        .order_by("gpu__node__hostname", "gpu__index", "id")
    )


def _started(b: Booking, ctx: dict) -> Message:
    held = _devices(b)
    nodes = sorted({a.gpu.node.hostname for a in held})
    uuids = ",".join(a.device_uuid for a in held)
    facts = [
        ("Node", ", ".join(nodes) or "-"),
        ("Devices", ", ".join(a.device_label for a in held) or "-"),
    ]
    lead = f"Your devices are ready and yours until {_when(_end_of(b))}."
    if b.borrowed:
        # Elastic quotas: the run may end early, when someone within their quota needs them.
        lead = (
            f"Your devices are ready until {_when(_end_of(b))}, borrowed past the"
            f" {b.borrowed_past} quota: the run may be preempted (and requeued) when a booking"
            " within its quota needs them."
        )
        facts.append(("Borrowed", f"yes, past the {b.borrowed_past} quota"))
    return Message(
        f"Booking {b.pk} is active{' (borrowed)' if b.borrowed else ''}: {b.describe_request()}"
        f" on {', '.join(nodes) or '-'}",
        lead,
        facts=facts,
        block_title="How to use them",
        block=f"ssh {nodes[0] if nodes else '<node>'}\nexport CUDA_VISIBLE_DEVICES={uuids}",
        actions=["extend", "release"],
    )


def _extended(b: Booking, ctx: dict) -> Message:
    end = _end_of(b)
    if end is None:  # still queued: it asks for longer
        hours = f"{b.duration_s / 3600:g}"
        return Message(
            f"Booking {b.pk} now asks for {hours} hours",
            f"Your queued request now asks for {hours} hours.",
            actions=["cancel"],
        )
    return Message(
        f"Booking {b.pk} extended to {_when(end)}",
        f"Your booking now ends at {_when(end)}.",
        actions=["release"] if b.state == Booking.State.ACTIVE else [],
    )


def _ending_soon(b: Booking, ctx: dict) -> Message:
    return Message(
        f"Booking {b.pk} ends at {_when(ctx.get('end'))}",
        f"Your {b.describe_request()} will be released at {_when(ctx.get('end'))}. "
        "Save your work, or extend if the devices are free.",
        actions=["extend", "release"],
    )


def booking_usage(b: Booking) -> dict:
    """GPU-hours held, mean utilization and energy of a booking, from its telemetry."""
    gpu_hours = energy_wh = 0.0
    utils = []
    for a in Allocation.objects.filter(booking=b).select_related("gpu", "mig_instance"):
        end = a.end if b.ended_at is None else min(a.end, b.ended_at)
        hours = max((end - a.start).total_seconds(), 0) / 3600
        gpu_hours += hours * a.fraction
        stats = Sample.objects.filter(uuid=a.device_uuid, time__gte=a.start, time__lt=end)
        row = stats.aggregate(util=Avg("utilization_gpu"), power=Avg("power_w"))
        if row["util"] is not None:
            utils.append(row["util"])
        if row["power"] is not None:
            energy_wh += row["power"] * hours
    return {
        "gpu_hours": round(gpu_hours, 2),
        "mean_utilization": round(sum(utils) / len(utils), 1) if utils else None,
        "energy_kwh": round(energy_wh / 1000, 3),
    }


_ENDED_HOW = {
    "finished": "reached its end time",
    "released": "was released",
    "cancelled": "was cancelled",
    "expired": "expired",
}


def _ended_how(b: Booking, what: str | None) -> str:
    """How it ended; a batch command that exited on its own says so, not "reached its end"."""
    if what == "finished" and b.command and b.state_detail.startswith("command "):
        return f"ended: its {b.state_detail}"
    return _ENDED_HOW.get(what, "ended")


def _ended(b: Booking, ctx: dict) -> Message:
    usage = booking_usage(b)
    util = usage["mean_utilization"]
    return Message(
        f"Booking {b.pk} ended: {usage['gpu_hours']:g} GPU-hours",
        f"Your booking {_ended_how(b, ctx.get('what'))}.",
        facts=[
            ("GPU-hours used", f"{usage['gpu_hours']:g}"),
            ("Mean utilization", "not measured" if util is None else f"{util:g} %"),
            ("Energy", f"{usage['energy_kwh']:g} kWh"),
        ],
    )


def _preempted(b: Booking, ctx: dict) -> Message:
    again = ctx.get("what") == "requeued"
    subject = (
        f"Booking {b.pk} is back in the queue: {ctx.get('detail') or 'requeued'}"
        if again
        else f"Booking {b.pk} was preempted"
    )
    return Message(
        subject,
        f"Your booking was stopped: {ctx.get('detail') or 'see the portal'}."
        + (" It waits in the queue again, keeping its place by age." if again else ""),
        actions=["cancel"] if again else [],
    )


def _failed(b: Booking, ctx: dict) -> Message:
    facts = [("Reason", ctx.get("detail") or b.state_detail or "-")]
    if b.exit_code is not None:
        facts.append(("Exit code", str(b.exit_code)))
    return Message(
        f"Booking {b.pk} failed: {ctx.get('detail') or b.state_detail or 'see the portal'}",
        "Your booking failed.",
        facts=facts,
        block_title="Last lines of the log" if b.log_tail else "",
        block="\n".join(b.log_tail.splitlines()[-20:]),
    )


def _idle(b: Booking, ctx: dict) -> Message:
    return Message(
        f"Booking {b.pk} is idle: it will be released at {_when(ctx.get('release_at'))}",
        f"Your devices stayed under {ctx.get('threshold', 0):g}% utilization for "
        f"{ctx.get('minutes')} minutes with none of your processes on them. They will be "
        f"released at {_when(ctx.get('release_at'))} for others unless you keep them.",
        actions=["keep", "release"],
    )


def _reclaimed(b: Booking, ctx: dict) -> Message:
    return Message(
        f"Booking {b.pk} was released: its devices sat idle",
        "Nobody kept your idle booking within the grace time, so its devices were released "
        "for the next bookings in the queue.",
        facts=[("GPU-hours used", f"{booking_usage(b)['gpu_hours']:g}")],
    )


def _budget(b: Booking, ctx: dict) -> Message:
    return Message(
        f"Project {b.project.slug}: {ctx.get('percent')}% of the GPU-hour budget used",
        f"You have used {ctx.get('used')} of {ctx.get('budget')} GPU-hours of your budget in "
        f"{b.project.slug}; new bookings are refused once it is spent.",
    )


def _maintenance(b: Booking, ctx: dict) -> Message:
    change = ctx.get("change", "created")
    return Message(
        f"Maintenance on {', '.join(ctx.get('nodes', []))[:120]}: booking {b.pk} collides",
        f"A maintenance window ({ctx.get('reason', '')}) was {change} from "
        f"{_when(ctx.get('start'))} to {_when(ctx.get('end'))} on the nodes your booking holds "
        "devices of. Your booking is not ended by it; expect the nodes to be worked on then.",
        facts=[("Maintenance window", str(ctx.get("window", "")))],
    )


_BUILDERS = {
    Event.QUEUED: _queued,
    Event.MOVED: _moved,
    Event.STARTING_SOON: _starting_soon,
    Event.STARTED: _started,
    Event.EXTENDED: _extended,
    Event.ENDING_SOON: _ending_soon,
    Event.ENDED: _ended,
    Event.PREEMPTED: _preempted,
    Event.FAILED: _failed,
    Event.IDLE: _idle,
    Event.RECLAIMED: _reclaimed,
    Event.BUDGET: _budget,
    Event.MAINTENANCE: _maintenance,
}


def _admin_message(notification: Notification) -> Message:
    ctx = notification.context or {}
    if notification.event == Event.NODE_DOWN:
        return Message(
            f"Node {ctx.get('node')} is down",
            f"Node {ctx.get('node')} is down: {ctx.get('detail')}. Its active bookings were "
            "failed or requeued.",
            link=f"{settings.SITE_URL}/admin/portal/node/",
        )
    alert = NodeAlert.objects.select_related("node").get(pk=ctx["alert"])
    return Message(
        f"GPU alert on {alert.node}: {alert.get_kind_display()}",
        alert.detail,
        facts=[("Action taken by the agent", alert.action or "report")],
        link=f"{settings.SITE_URL}/admin/portal/nodealert/{alert.pk}/change/",
    )


def email_parts(message: Message) -> tuple[str, str, str]:
    """Subject, plain text and HTML of the email."""
    actions = [(ACTIONS[a], action_url(booking=message.booking, action=a)) for a in message.actions]
    context = {"m": message, "actions": actions, "site_url": settings.SITE_URL}
    text = render_to_string("notifications/email.txt", context)
    html = render_to_string("notifications/email.html", context)
    # One line: a node's text with a CR/LF (stored before the protocol refused it) must not make
    # a header Django refuses, and so a mail that fails on every try.
    return " ".join(message.subject.split()), text, html


def slack_text(text: str) -> str:
    """Text as it may stand in Slack mrkdwn: `&`, `<` and `>` escaped (Slack's own rule), so a
    job's output, an alert's detail or a GPU model cannot mention `<!channel>` or make a link
    dressed as a button. Every user- or node-controlled string goes through here."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _code_text(text: str) -> str:
    # A zero-width space after every backtick: no three of them in a row close the block early.
    return slack_text(text).replace("`", "`\u200b")


# Block Kit's limits (characters; counted here as UTF-16 units, never fewer than Slack's count).
# Past one, Slack answers 400 invalid_blocks and the message is lost, so text is cut to fit.
SLACK_SECTION_MAX = 3000  # a section's text
SLACK_FIELD_MAX = 2000  # each of a section's fields
SLACK_HEADER_MAX = 150  # a header's plain text
_FENCE = "```"


def _units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def slack_fit(text: str, limit: int, *, escape=slack_text, keep_end: bool = False) -> str:
    """``escape(text)`` in at most ``limit`` characters: whole, or cut after escaping (never
    inside an escape) with "… (truncated, N characters)" saying how many of the text's own
    characters were left out. ``keep_end`` keeps the end (a log's last lines), else the start."""
    whole = escape(text)
    if _units(whole) <= limit:
        return whole
    room = limit - _units(f"… (truncated, {len(text)} characters)") - 1
    chars = reversed(text) if keep_end else iter(text)
    kept: list[str] = []
    for char in chars:
        piece = escape(char)
        room -= _units(piece)
        if room < 0:
            break
        kept.append(piece)
    marker = f"… (truncated, {len(text) - len(kept)} characters)"
    if keep_end:
        return marker + "\n" + "".join(reversed(kept))
    return "".join(kept) + " " + marker


def slack_code(text: str, *, limit: int = SLACK_SECTION_MAX) -> str:
    """A code block the text cannot leave (escaped, backticks broken up), at most ``limit``
    characters fences included: a longer text keeps its end, and the closing fence."""
    inner = slack_fit(text, limit - 2 * len(_FENCE), escape=_code_text, keep_end=True)
    return _FENCE + inner + _FENCE


def slack_payload(message: Message) -> dict:
    """The Block Kit message: header, sentence, facts, code block, buttons, link; every text
    escaped, then cut to its block's limit."""
    blocks = [
        {
            "type": "header",
            "text": {"type": "plain_text", "text": message.subject[:SLACK_HEADER_MAX]},
        },
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": slack_fit(message.intro, SLACK_SECTION_MAX)},
        },
    ]
    if message.facts:
        blocks.append({"type": "section", "fields": [_fact(*f) for f in message.facts[:10]]})
    if message.block:
        title = f"*{slack_text(message.block_title)}*\n" if message.block_title else ""
        code = slack_code(message.block, limit=SLACK_SECTION_MAX - _units(title))
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": title + code}})
    buttons = [
        {
            "type": "button",
            "action_id": action,
            "text": {"type": "plain_text", "text": ACTIONS[action]},
            "value": action_token(booking=message.booking, action=action),
            **({"style": "danger"} if action in ("release", "cancel") else {}),
            **({"style": "primary"} if action in ("extend", "keep") else {}),
        }
        for action in message.actions
    ]
    if message.link:
        buttons.append(
            {
                "type": "button",
                "action_id": "open",
                "text": {"type": "plain_text", "text": "Open in the portal"},
                "url": message.link,
            }
        )
    if buttons:
        blocks.append({"type": "actions", "elements": buttons})
    # The top-level text (the notification's preview) is mrkdwn too.
    return {"text": slack_text(message.subject), "blocks": blocks}


def _fact(label: str, value: str) -> dict:
    head = f"*{slack_text(label)}*\n"
    return {"type": "mrkdwn", "text": head + slack_fit(value, SLACK_FIELD_MAX - _units(head))}


def webhook_payload(message: Message, *, event: str, delivery_key: str) -> dict:
    """The generic JSON webhook body."""
    booking = message.booking
    return {
        "event": event,
        "delivery": delivery_key,
        "subject": message.subject,
        "text": message.intro,
        "facts": dict(message.facts),
        "link": message.link,
        "booking": (
            {"id": booking.pk, "state": booking.state, "owner": booking.owner.username}
            if booking
            else None
        ),
        "actions": {a: action_url(booking=booking, action=a) for a in message.actions},
    }
