"""Mail kept in a folder instead of sent: what `manage.py up` uses unless EMAIL_BACKEND says
otherwise, so the demo's notifications stay off the console. One file per message
(EMAIL_FILE_PATH, default VAR_DIR/mail), listed for staff at /staff/mail/."""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.utils import parsedate_to_datetime
from pathlib import Path

from django.conf import settings
from django.core.mail.backends.base import BaseEmailBackend

log = logging.getLogger(__name__)

# Names the backend gives its files, and the only ones the pages open.
_NAME = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{8}\.eml$")


def mail_folder() -> Path:
    return Path(settings.EMAIL_FILE_PATH)


class FolderEmailBackend(BaseEmailBackend):
    """Writes each message as one .eml file in EMAIL_FILE_PATH; a line at INFO per message."""

    def send_messages(self, email_messages) -> int:
        folder = mail_folder()
        folder.mkdir(parents=True, exist_ok=True)
        sent = 0
        for message in email_messages:
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
            path = folder / f"{stamp}-{uuid.uuid4().hex[:8]}.eml"
            path.write_bytes(message.message().as_bytes())
            log.info("mail to %s: %s (%s)", ", ".join(message.to), message.subject, path.name)
            sent += 1
        return sent


@dataclass(frozen=True)
class StoredMail:
    """One kept message: its file name, when, to whom, what about, and its plain text."""

    name: str
    date: datetime | None
    to: str
    subject: str
    text: str


def mailbox_list(*, limit: int = 200) -> list[StoredMail]:
    """The newest kept messages first."""
    folder = mail_folder()
    if not folder.is_dir():
        return []
    names = sorted((p.name for p in folder.iterdir() if _NAME.match(p.name)), reverse=True)
    return [_read(folder / name) for name in names[:limit]]


def mailbox_get(name: str) -> StoredMail | None:
    """One kept message by its file name; None for a name the backend would not have written."""
    path = mail_folder() / name
    if not _NAME.match(name) or not path.is_file():
        return None
    return _read(path)


def _read(path: Path) -> StoredMail:
    message = message_from_bytes(path.read_bytes(), policy=policy.default)
    body = message.get_body(preferencelist=("plain",))
    try:
        date = parsedate_to_datetime(message["Date"]) if message["Date"] else None
    except (TypeError, ValueError):
        date = None
    return StoredMail(
        name=path.name,
        date=date,
        to=str(message["To"] or ""),
        subject=str(message["Subject"] or ""),
        text=body.get_content() if body is not None else "",
    )
