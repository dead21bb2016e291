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
    services = _compose()["services"]
    assert set(services) == {
        "postgres", "redis", "migrate", "web", "pass-worker", "worker", "beat", "proxy", "simnode",
        "agent"
    }  # fmt: skip
    assert services["simnode"]["profiles"] == ["demo"]  # only with --profile demo
    assert services["agent"]["profiles"] == ["agent"]


def test_it_migrates_once_before_web_worker_and_beat_start():
    services = _compose()["services"]
    assert "manage.py migrate" in services["migrate"]["command"]
    assert services["migrate"]["restart"] == "no"
    for name in ("web", "pass-worker", "worker", "beat"):
        assert "migrate" not in services[name]["command"]
        condition = services[name]["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully", name
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_it_checks_web_health_and_starts_the_simulated_node_after_it():
    services = _compose()["services"]
    probe = services["web"]["healthcheck"]["test"]
    assert probe[:2] == ["CMD", "python"] and "/readyz" in probe[-1]
    assert services["simnode"]["depends_on"]["web"]["condition"] == "service_healthy"
    assert "python -m agents --portal http://web:8000" in services["simnode"]["command"]
    assert "web" in services["web"]["environment"]["ALLOWED_HOSTS"].split(",")


def test_it_creates_the_first_admin_from_a_secret_file():
    migrate = _compose()["services"]["migrate"]
    assert "manage.py ensure_admin" in migrate["command"]
    assert migrate["environment"]["PORTAL_ADMIN_PASSWORD_FILE"].startswith("/run/secrets/")
    assert "PORTAL_ADMIN_PASSWORD" not in migrate["environment"]


# What a checkout holds besides its tracked files: secrets beside the compose file, local state.
LEFT_IN_A_CHECKOUT = [
    "admin-password.txt",
    "smtp-password.txt",
    "node-token.txt",
    "redis-password.txt",
    "secrets/app-db-password",
    "portal.env",
    ".env",
    "var/db.sqlite3",
    "var/agents/site-id",
    ".venv/bin/python",
    ".git/config",
    "test-artifacts/report.xml",
    "staticfiles/portal/app.css",
    "db.sqlite3",
    "portal/__pycache__/settings.cpython-311.pyc",
    "portal/cli/build/lib/gpu_portal_cli.py",
    "gpu_portal.egg-info/PKG-INFO",
    "portal/.env",
]
# What the image runs: the packages `pip install .` installs, what it reads, and what manage.py
# serves from the checkout (templates, static files).
IMAGE_NEEDS = ("pyproject.toml", "README.md", "manage.py")
IMAGE_DIRS = ("portal/", "scheduler/", "agents/", "templates/", "static/")


def _build_context(root: Path) -> set[str]:
    """The files `docker build` sends for `root` under this checkout's .dockerignore, matched
    as the Docker SDK matches it."""
    from docker.utils.build import exclude_paths

    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return {path for path in exclude_paths(str(root), patterns) if (root / path).is_file()}


def test_it_builds_the_image_from_an_allow_list_that_keeps_secrets_out(tmp_path):
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for path in [*tracked, *LEFT_IN_A_CHECKOUT]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x")
    context = _build_context(tmp_path)
    assert context & set(LEFT_IN_A_CHECKOUT) == set()
    needed = {p for p in tracked if p in IMAGE_NEEDS or p.startswith(IMAGE_DIRS)}
    assert needed - context == set()  # the image lacks nothing it runs
    # and nothing else (tests, docs, deploy, ...); the rules themselves always go with it.
    assert context - needed <= {".dockerignore"}
    assert "templates/notifications/email.txt" in context
    image = _compose()["x-portal"]["build"]
    assert image["context"] == "." and "COPY . /app" in image["dockerfile_inline"]


def test_it_is_a_valid_compose_file_for_docker_compose():
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("docker compose is not installed")
    env = os.environ | {
        "SECRET_KEY": "x" * 50,
        "PORTAL_HOST": "gpus.example.org",
        "POSTGRES_PASSWORD": "0wner",
        "PORTAL_APP_DB_PASSWORD": "app0",
        "REDIS_PASSWORD_FILE": "/dev/null",
    }
    command = ["docker", "compose", "--profile", "demo", "config", "--quiet"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    del env["POSTGRES_PASSWORD"]  # no default: compose stops, naming it
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode != 0 and "set POSTGRES_PASSWORD" in result.stderr


def test_it_points_compose_commands_at_code_that_exists():
    services = _compose()["services"]
    assert "python manage.py serve " in services["web"]["command"]
    serve = (ROOT / "portal" / "management" / "commands" / "serve.py").read_text()
    assert '"portal.asgi:application"' in serve
    module, _, attr = "portal.asgi:application".partition(":")
    assert hasattr(import_module(module), attr)
    for name in ("pass-worker", "worker", "beat"):
        assert services[name]["command"].startswith("celery -A portal ")
    # The allocation pass has its own queue and worker; the other worker takes the rest.
    assert "--queues allocation " in services["pass-worker"]["command"]
    assert "--queues celery " in services["worker"]["command"]
    from portal.celery import app

    app.loader.import_default_modules()
    assert "portal.tasks.allocation_pass" in app.tasks


def test_it_only_sets_environment_variables_that_settings_read():
    # settings.py, and the sign-in settings it reads through portal/sso/config.py.
    source = (ROOT / "portal" / "settings.py").read_text()
    source += (ROOT / "portal" / "sso" / "config.py").read_text()
    for name in _compose()["services"]["web"]["environment"]:  # merged from x-portal
        read = name.removesuffix("_FILE")  # env("NAME") reads NAME_FILE too (portal/env.py)
        assert f'"{read}"' in source, f"docker-compose sets {name} but settings never read it"


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


def test_it_connects_as_a_role_that_does_not_own_the_tables_except_to_migrate():
    services = _compose()["services"]
    for name in ("web", "pass-worker", "worker", "beat"):
        assert services[name]["environment"]["DATABASE_URL"].startswith("postgres://portal_app:")
    assert services["migrate"]["environment"]["DATABASE_URL"].startswith("postgres://portal:")
    mounts = services["postgres"]["volumes"]
    assert "./deploy/postgres/app-role.sql:/docker-entrypoint-initdb.d/app-role.sql.in:ro" in mounts
    script = (ROOT / "deploy" / "postgres" / "10-app-role.sh").read_text()
    assert "app-role.sql.in" in script and "app_role=portal_app" in script
