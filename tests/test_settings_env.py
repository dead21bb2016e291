"""Settings fail loudly: a value that does not parse stops the start, naming the variable."""

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from portal.env import SettingError, envbool, envfloat, envint
from portal.notify_env import notify_settings
from portal.policy_env import policy_settings
from portal.sso.config import sign_in_settings


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", True),
        ("true", True),
        ("True", True),
        (" YES ", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("FALSE", False),
        ("no", False),
        (" Off\n", False),
    ],
)
def test_it_reads_the_usual_boolean_spellings(monkeypatch, text, value):
    monkeypatch.setenv("PORTAL_FLAG", text)
    assert envbool("PORTAL_FLAG", "False") is value
    assert envbool("PORTAL_FLAG", "True") is value


@pytest.mark.parametrize("text", ["", "  "])
def test_it_takes_an_empty_boolean_as_its_default(monkeypatch, text):
    monkeypatch.setenv("PORTAL_FLAG", text)
    assert envbool("PORTAL_FLAG", "True") is True
    assert envbool("PORTAL_FLAG", "False") is False


@pytest.mark.parametrize(
    ("helper", "text", "expected"),
    [
        (envbool, "ture", "true or false"),
        (envbool, "enabled", "true or false"),
        (envbool, "2", "true or false"),
        (envint, "two", "a whole number"),
        (envint, "2.5", "a whole number"),
        (envfloat, "fast", "a number"),
        (envfloat, "nan", "a number"),
    ],
)
def test_it_refuses_a_value_that_does_not_parse_naming_it(monkeypatch, helper, text, expected):
    monkeypatch.setenv("PORTAL_KNOB", text)
    default = {envbool: "False", envint: 1, envfloat: 1.0}[helper]
    with pytest.raises(SettingError) as raised:
        helper("PORTAL_KNOB", default)
    message = str(raised.value)
    assert "PORTAL_KNOB" in message and repr(text) in message and expected in message


def test_it_has_one_error_type_for_a_bad_setting(monkeypatch):
    assert issubclass(SettingError, ImproperlyConfigured)
    with pytest.raises(SettingError, match="SCHEDULER_BACKFILL"):
        policy_settings({"SCHEDULER_BACKFILL": "aggressive"})
    with pytest.raises(SettingError, match="SCHEDULER_ESTIMATE_ALL"):
        policy_settings({"SCHEDULER_ESTIMATE_ALL": "maybe"})
    monkeypatch.setenv("NOTIFY_MAX_ATTEMPTS", "0")
    with pytest.raises(SettingError, match="NOTIFY_MAX_ATTEMPTS"):
        notify_settings()
    monkeypatch.setenv("NOTIFY_MAX_ATTEMPTS", "many")
    with pytest.raises(SettingError, match="NOTIFY_MAX_ATTEMPTS='many'"):
        notify_settings()
    with pytest.raises(SettingError, match="nobody could sign in"):
        sign_in_settings(lambda name, default="": {"LOCAL_LOGIN_ENABLED": "no"}.get(name, default))


OIDC = {
    "OIDC_RP_CLIENT_ID": "portal",
    "OIDC_RP_CLIENT_SECRET": "s",
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "https://idp/auth",
    "OIDC_OP_TOKEN_ENDPOINT": "https://idp/token",
    "OIDC_OP_USER_ENDPOINT": "https://idp/user",
    "OIDC_OP_JWKS_ENDPOINT": "https://idp/jwks",
}


@pytest.mark.parametrize(
    "env",
    [
        {"OIDC_VERIFY_SSL": "yes please"},
        {"OIDC_CREATE_USER": "nope"},
        {"LOCAL_LOGIN_ENABLED": "disabled"},
    ],
)
def test_it_refuses_a_sign_in_boolean_that_does_not_parse(env):
    full = OIDC | env
    (name,) = env
    with pytest.raises(SettingError, match=name):
        sign_in_settings(lambda n, d="": full.get(n, d))


def _start(**env: str) -> subprocess.CompletedProcess:
    environ = os.environ | {"DJANGO_SETTINGS_MODULE": "portal.settings_test"} | env
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("name", "value", "others"),
    [
        ("DEBUG", "ture", {}),
        ("BEHIND_TLS_PROXY", "enabled", {}),
        ("WEB_WORKERS", "two", {}),
        ("DB_POOL_TIMEOUT_S", "soon", {}),
        ("SCHEDULER_RESERVATION_DEPTH", "deep", {}),
        ("SCHEDULER_BACKFILL", "aggressive", {}),
        ("NOTIFY_SEND_TIMEOUT_S", "ten", {}),
        ("IDLE_RECLAIM_ENABLED", "sometimes", {}),
        ("LOCAL_LOGIN_ENABLED", "disabled", {}),
        ("OIDC_VERIFY_SSL", "maybe", OIDC),
        ("TOKEN_CACHE_S", "-5", {}),
        ("ESTIMATE_RATE", "lots", {}),
        ("DB_POOL_TIMEOUT_S", "90", {}),
        ("NOTIFY_ALLOW_HTTP", "sure", {}),
        ("NOTIFY_ALLOWED_NETWORKS", "10.0.0.0/33", {}),
        ("SESSION_ALLOWED_NETWORKS", "intranet", {}),
        ("SESSION_PORTS", "60999-32768", {}),
        ("SESSION_PORTS", "8888", {}),
        # Tracebacks once, or Django's own errors.
        ("DATABASE_URL", "notaurl", {}),
        ("DATABASE_URL", "mysql://portal@db.example.org/portal", {}),
        ("DATABASE_URL", "postgres://db:port/portal", {}),
        ("DATABASE_URL", "postgres://", {}),
        ("LOG_LEVEL", "LOUD", {}),
        ("TIME_ZONE", "Mars/Olympus_Mons", {}),
        ("CSRF_TRUSTED_ORIGINS", "gpu.example.org", {}),
        ("PORTAL_VAR_DIR", "/proc/no/such/dir", {"DATABASE_URL": ""}),  # embedded: it holds the db
        # Started, and wrote thousands of lines.
        ("REDIS_URL", "http://127.0.0.1:6379/0", {}),
        ("REDIS_URL", "redis://127.0.0.1:99999/0", {}),
        # Started silently with a value that cannot work.
        ("TRUSTED_PROXY_COUNT", "-1", {}),
        ("EMAIL_PORT", "99999", {}),
        ("EMAIL_TIMEOUT", "0", {}),
        ("AGENT_REPORT_INTERVAL_S", "0", {}),
        ("NODE_HEARTBEAT_TIMEOUT_S", "2", {"AGENT_REPORT_INTERVAL_S": "5"}),
        ("TELEMETRY_RAW_RETENTION_H", "-1", {}),
        ("TELEMETRY_ROLLUP_RETENTION_D", "0", {}),
        ("SCHEDULER_PASS_INTERVAL_S", "0", {}),
        ("OUTBOX_SWEEP_INTERVAL_S", "-5", {}),
        ("SITE_URL", "ftp://x", {}),
        ("SITE_URL", "not_a_url", {}),
        ("SLACK_WEBHOOK_URL", "hooks.slack.com/services/x", {}),
        ("SLACK_API_URL", "ftp://slack.com/api", {}),
        ("CELERY_PASS_QUEUE", "pass queue", {}),
        ("BOOKING_LOCK_TIMEOUT_MS", "0", {}),
        ("LOGIN_FAILURE_LIMIT", "0", {}),
        ("WEB_THREADS", "\u0663", {}),  # an Arabic-Indic three: ASCII digits only
    ],
)
def test_it_stops_the_start_with_one_line_naming_the_variable(name, value, others):
    done = _start(**others, **{name: value})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Bad setting: ") and name in lines[0] and value in lines[0]
    assert "Traceback" not in done.stderr


def test_it_shows_no_database_password_in_the_line():
    done = _start(DATABASE_URL="mysql://portal:s3cret@db.example.org/portal")
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("Bad setting: DATABASE_URL") and "s3cret" not in line


@pytest.mark.parametrize(
    "command",
    [
        ["manage.py", "up", "--no-demo", "--port", "8797"],
        ["manage.py", "serve", "--port", "8797"],
        ["-m", "celery", "-A", "portal", "worker", "--loglevel", "WARNING"],
        ["-m", "celery", "-A", "portal", "beat", "--loglevel", "WARNING"],
        ["-m", "uvicorn", "portal.asgi:application", "--port", "8797"],
        ["-c", "import portal.wsgi"],
    ],
)
def test_it_stops_every_entry_point_with_the_same_line(command):
    environ = os.environ | {
        "DJANGO_SETTINGS_MODULE": "portal.settings_test",
        "TRUSTED_PROXY_COUNT": "-1",
    }
    done = subprocess.run(
        [sys.executable, *command], env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "Bad setting: TRUSTED_PROXY_COUNT='-1': expected a whole number from 0 to 10"
    ]


def test_it_loads_no_settings_when_the_cli_imports_the_package():
    # `gpu-portal` lives in the portal package: a user's shell with the portal's variables set
    # wrongly (or not at all) must not matter to it.
    environ = {"PATH": os.environ["PATH"], "LOG_LEVEL": "LOUD", "HOME": os.environ["HOME"]}
    code = "import portal.cli.main, django.conf as c; print(c.settings.configured)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


@pytest.mark.parametrize(
    "environ",
    [
        {
            "DATABASE_URL": "postgres:///gpuportal",  # the local socket
            "REDIS_URL": "rediss://:secret@redis.example.org:6380/0",
            "SITE_URL": "https://gpu.example.org/",
            "LOG_LEVEL": "warning",
            "TRUSTED_PROXY_COUNT": "1",
            "CSRF_TRUSTED_ORIGINS": "https://gpu.example.org,https://*.example.org",
        },
        {
            "DATABASE_URL": "sqlite:////tmp/portal-settings-check.sqlite3",
            "REDIS_URL": "unix:///run/redis/redis.sock?db=0",
            "EMAIL_PORT": "587",
        },
    ],
)
def test_it_starts_with_the_usual_forms_of_the_checked_settings(environ):
    done = _start(**environ)
    assert done.returncode == 0, done.stderr


def test_it_starts_with_valid_spellings():
    done = _start(DEBUG=" Yes ", IDLE_RECLAIM_ENABLED="off", WEB_WORKERS="3")
    assert done.returncode == 0, done.stderr


def test_it_reads_a_secret_from_its_file_and_names_a_missing_file(monkeypatch, tmp_path):
    from portal.env import env

    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("PORTAL_KEY_FILE", str(secret))
    assert env("PORTAL_KEY") == "s3cret"
    monkeypatch.setenv("PORTAL_KEY_FILE", str(tmp_path / "gone"))
    with pytest.raises(SettingError, match="PORTAL_KEY_FILE=.*gone"):
        env("PORTAL_KEY")


def _names_assigned_in_settings() -> set[str]:
    import ast
    from pathlib import Path

    import portal.settings

    tree = ast.parse(Path(portal.settings.__file__).read_text())
    assigned = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    calls = {
        node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert "globals" not in calls, "settings.py names its settings; no globals().update"
    return assigned


def test_it_names_every_notification_and_sign_in_setting_in_settings_py():
    from portal.sso.config import ldap_settings

    ldap = {
        "LDAP_SERVER_URI": "ldap://127.0.0.1",
        "LDAP_USER_SEARCH_BASE": "ou=people,dc=x",
        "LDAP_GROUP_SEARCH_BASE": "ou=groups,dc=x",
    }
    provided = (
        set(notify_settings())
        | set(sign_in_settings(lambda n, d="": OIDC.get(n, d)))
        | set(ldap_settings(lambda n, d="": ldap.get(n, d)))
    )
    assert provided - _names_assigned_in_settings() == set()


def test_it_authenticates_to_smtp_with_a_password_file_and_refuses_tls_with_ssl(tmp_path):
    secret = tmp_path / "smtp_password"
    secret.write_text("mail-pass\n")
    probe = (
        "from django.conf import settings as s; "
        "print(s.EMAIL_HOST_USER, s.EMAIL_HOST_PASSWORD, s.EMAIL_USE_TLS, s.EMAIL_PORT)"
    )
    environ = os.environ | {
        "DJANGO_SETTINGS_MODULE": "portal.settings_test",
        "EMAIL_HOST_USER": "gpu-portal",
        "EMAIL_HOST_PASSWORD_FILE": str(secret),
        "EMAIL_USE_TLS": "1",
        "EMAIL_PORT": "587",
    }
    shown = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", probe],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = shown.stdout.strip().splitlines()[-1]  # after the shell's own line about imports
    assert last.split() == ["gpu-portal", "mail-pass", "True", "587"], shown.stderr

    both = _start(EMAIL_USE_TLS="1", EMAIL_USE_SSL="1")
    assert both.returncode != 0
    assert "EMAIL_USE_TLS and EMAIL_USE_SSL are both on" in both.stderr
    assert "Traceback" not in both.stderr
