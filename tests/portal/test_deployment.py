"""The production setup stays in step with the code: compose file, deploy checks, migrations."""

import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.core.management import call_command

ROOT = Path(settings.BASE_DIR)
PROD_ENV = {
    "DATABASE_URL": "postgres://portal:secret@db.example.org:5432/portal",
    "REDIS_URL": "redis://cache.example.org:6379/0",
    "SECRET_KEY": "k" * 10 + "Zx9!q" * 10,
    "ALLOWED_HOSTS": "gpus.example.org",
    "DEBUG": "0",
    "BEHIND_TLS_PROXY": "1",
}


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_it_defines_every_production_service():
    assert set(_compose()["services"]) == {"postgres", "redis", "web", "worker", "beat"}


def test_it_points_compose_commands_at_code_that_exists():
    services = _compose()["services"]
    assert "python manage.py serve " in services["web"]["command"]
    serve = (ROOT / "portal" / "management" / "commands" / "serve.py").read_text()
    assert '"portal.asgi:application"' in serve
    module, _, attr = "portal.asgi:application".partition(":")
    assert hasattr(import_module(module), attr)
    for name in ("worker", "beat"):
        assert services[name]["command"].startswith("celery -A portal ")
    from portal.celery import app

    app.loader.import_default_modules()
    assert "portal.tasks.allocation_pass" in app.tasks


def test_it_only_sets_environment_variables_that_settings_read():
    source = (ROOT / "portal" / "settings.py").read_text()
    for name in _compose()["services"]["web"]["environment"]:
        assert f'"{name}"' in source, f"docker-compose sets {name} but settings never read it"


def test_it_passes_the_deploy_checks_under_production_settings():
    env = {
        k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PORTAL_VAR_DIR")
    }
    env.update(PROD_ENV, DJANGO_SETTINGS_MODULE="portal.settings")
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_it_refuses_to_start_in_server_mode_without_a_secret_key():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(PROD_ENV, SECRET_KEY="", DJANGO_SETTINGS_MODULE="portal.settings")
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "Set SECRET_KEY" in result.stderr


@pytest.mark.django_db
def test_it_has_no_model_changes_without_a_migration():
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def _server_setting(name: str, **extra: str) -> str:
    """One setting as server mode (PostgreSQL + Redis, DEBUG off) computes it, with `extra` env."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(PROD_ENV, DJANGO_SETTINGS_MODULE="portal.settings")
    del env["BEHIND_TLS_PROXY"]
    env.update(extra)
    code = (
        f"import django; django.setup(); from django.conf import settings; print(settings.{name})"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_it_serves_plain_http_in_server_mode_unless_behind_a_tls_proxy():
    assert _server_setting("SECURE_SSL_REDIRECT") == "False"
    assert _server_setting("SESSION_COOKIE_SECURE") == "False"
    assert _server_setting("SECURE_SSL_REDIRECT", BEHIND_TLS_PROXY="1") == "True"
    assert _server_setting("SESSION_COOKIE_SECURE", BEHIND_TLS_PROXY="1") == "True"
