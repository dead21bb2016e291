"""`manage.py ensure_admin`: the first administrator from the environment, once."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db
STRONG = "velvet-otter-quarry-42"


def test_it_creates_the_admin_once_from_a_password_file(monkeypatch, tmp_path):
    secret = tmp_path / "admin_password"
    secret.write_text(STRONG + "\n")
    monkeypatch.setenv("PORTAL_ADMIN_USERNAME", "root-admin")
    monkeypatch.setenv("PORTAL_ADMIN_EMAIL", "ops@example.org")
    monkeypatch.setenv("PORTAL_ADMIN_PASSWORD_FILE", str(secret))
    call_command("ensure_admin", verbosity=0)
    admin = get_user_model().objects.get(username="root-admin")
    assert admin.is_superuser and admin.is_staff and admin.check_password(STRONG)
    admin.set_password("changed-later-by-the-admin-77")
    admin.save()
    secret.write_text("another-password-entirely-88")
    call_command("ensure_admin", verbosity=0)  # every start runs it: nothing changes
    admin.refresh_from_db()
    assert admin.check_password("changed-later-by-the-admin-77")
    assert get_user_model().objects.filter(is_superuser=True).count() == 1


def test_it_does_nothing_without_a_username(monkeypatch):
    monkeypatch.delenv("PORTAL_ADMIN_USERNAME", raising=False)
    call_command("ensure_admin", verbosity=0)
    assert not get_user_model().objects.exists()


@pytest.mark.parametrize("password", ["12345678901234", "", "short"])
def test_it_refuses_a_weak_or_missing_password(monkeypatch, password):
    monkeypatch.setenv("PORTAL_ADMIN_USERNAME", "root-admin")
    monkeypatch.delenv("PORTAL_ADMIN_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("PORTAL_ADMIN_PASSWORD", password)
    with pytest.raises(CommandError, match="PORTAL_ADMIN_PASSWORD|root-admin"):
        call_command("ensure_admin", verbosity=0)
    assert not get_user_model().objects.exists()


def test_it_names_an_unreadable_password_file(monkeypatch, tmp_path):
    monkeypatch.setenv("PORTAL_ADMIN_USERNAME", "root-admin")
    monkeypatch.setenv("PORTAL_ADMIN_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(CommandError, match="PORTAL_ADMIN_PASSWORD_FILE"):
        call_command("ensure_admin", verbosity=0)
