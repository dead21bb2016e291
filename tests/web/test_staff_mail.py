"""Mail kept in a folder (`manage.py up`'s default) and the staff pages that list it."""

import logging

import pytest
from django.core import mail as django_mail
from django.core.mail import EmailMultiAlternatives

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def folder(settings, tmp_path):
    settings.EMAIL_BACKEND = "portal.mailbox.FolderEmailBackend"
    settings.EMAIL_FILE_PATH = str(tmp_path / "mail")
    return tmp_path / "mail"


def _send(subject: str, to: str = "bob@example.org") -> None:
    message = EmailMultiAlternatives(
        subject,
        f"Hello.\n{subject} in plain text.\n",
        "portal@example.org",
        [to],
        connection=django_mail.get_connection(),
    )
    message.attach_alternative(f"<p>{subject} in HTML</p>", "text/html")
    message.send()


def test_it_keeps_each_message_in_one_file_with_one_line_at_info(folder, caplog):
    caplog.set_level(logging.INFO, logger="portal.mailbox")
    _send("Booking 7 is active")
    _send("Booking 8 reached its end time")

    assert len(list(folder.glob("*.eml"))) == 2
    lines = [r for r in caplog.records if r.name == "portal.mailbox"]
    assert [r.levelname for r in lines] == ["INFO", "INFO"]
    assert "bob@example.org: Booking 7 is active" in lines[0].getMessage()


def test_it_lists_kept_mail_for_staff_newest_first_and_shows_the_text(client, folder):
    _send("First message")
    _send("Second message", to="alice@example.org")
    client.force_login(UserFactory(username="root", is_staff=True))

    body = client.get("/staff/mail/").content.decode()
    assert body.index("Second message") < body.index("First message")
    assert "alice@example.org" in body and str(folder) in body
    (name,) = [p.name for p in folder.glob("*.eml") if "Second" in p.read_text()]
    detail = client.get(f"/staff/mail/{name}/").content.decode()
    assert "Second message in plain text." in detail and "in HTML" not in detail
    assert 'href="/staff/mail/"' in client.get("/staff/").content.decode()


def test_it_keeps_kept_mail_from_non_staff_and_opens_only_its_own_files(client, user, folder):
    _send("Private")
    client.force_login(user)
    assert client.get("/staff/mail/").status_code == 403
    client.force_login(UserFactory(username="root", is_staff=True))
    assert client.get("/staff/mail/..%2F..%2Fsecret/").status_code == 404
    assert client.get("/staff/mail/notes.txt/").status_code == 404
