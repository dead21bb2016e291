"""docker-compose.yml can configure a real site: it is a valid Compose file (the Compose
Specification's JSON schema, vendored in tests/data/), every setting the docs name reaches the
portal's containers through the env file, Caddy in front carries TLS and websockets, and only
the proxy publishes ports."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import yaml

from portal.web.asgi_process import free_port

ROOT = Path(__file__).resolve().parents[2]
PORTAL_SERVICES = ("migrate", "web", "worker", "beat")
# What docker-compose.yml wires itself (its services, the proxy, the site's name).
WIRED = {
    "DATABASE_URL",
    "REDIS_URL",
    "BEHIND_TLS_PROXY",
    "TRUSTED_PROXY_COUNT",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "SITE_URL",
    "EMAIL_BACKEND",
}
# The helpers settings read the environment through (portal/env.py, portal/sso/config.py).
_READ = (
    r"(?:env|envint|envbool|envfloat|envlist|envchoice|envurl|_read|_bool)\(\s*(?:env,\s*)?\"{}\""
)


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def documented_settings() -> set[str]:
    """Every environment variable docs/ and the README name that the portal reads."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings_test")
    from portal.policy_env import policy_env_names

    text = "".join(p.read_text() for p in [*ROOT.glob("docs/*.md"), ROOT / "README.md"])
    named = set(re.findall(r"`([A-Z][A-Z0-9_]{2,})(?:=[^`]*)?`", text))
    sources = ("portal/settings.py", "portal/sso/config.py", "portal/notify_env.py")
    source = "".join((ROOT / name).read_text() for name in sources)
    read = {name for name in named if re.search(_READ.format(name), source)}
    return read | set(policy_env_names().values())


def _example_names() -> set[str]:
    text = (ROOT / "deploy" / "portal.env.example").read_text()
    return set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", text, re.MULTILINE))


def test_it_is_valid_under_the_compose_specification_schema():
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    errors = [
        f"{'/'.join(map(str, e.path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(_compose())
    ]
    assert errors == []


def test_it_names_every_documented_setting_in_the_example_env_file():
    documented = documented_settings()
    assert {"TRUSTED_PROXY_COUNT", "METRICS_TOKEN", "EMAIL_HOST_USER", "LOG_LEVEL"} <= documented
    assert {"SCHEDULER_WEIGHT_AGE", "IDLE_MINUTES", "LDAP_SERVER_URI"} <= documented
    assert documented - _example_names() == set()


def test_it_passes_every_setting_through_to_the_portals_containers():
    services = _compose()["services"]
    documented = documented_settings()
    for name in PORTAL_SERVICES:
        service = services[name]
        assert service["env_file"] == [{"path": "portal.env", "required": True}], name
        # A name compose sets itself would override the env file's value: only the wired ones.
        overridden = documented & set(service["environment"])
        assert overridden <= WIRED, (name, overridden - WIRED)
    assert services["web"]["environment"]["TRUSTED_PROXY_COUNT"] == "1"


def test_it_publishes_only_the_proxys_ports_and_carries_websockets_through_it():
    services = _compose()["services"]
    published = {name for name, service in services.items() if service.get("ports")}
    assert published == {"proxy"}
    assert services["proxy"]["ports"] == ["80:80", "443:443"]
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in services["proxy"]["volumes"]
    caddyfile = (ROOT / "deploy" / "Caddyfile").read_text()
    # Caddy's reverse_proxy upgrades websockets itself; one proxy = TRUSTED_PROXY_COUNT 1.
    assert "reverse_proxy web:8000" in caddyfile and "{$PORTAL_HOST}" in caddyfile
    assert "tls {$CADDY_TLS:internal}" in caddyfile


def test_it_gives_the_smtp_password_as_a_secret_file():
    compose = _compose()
    assert compose["secrets"]["smtp_password"]["file"] == "${SMTP_PASSWORD_FILE:-/dev/null}"
    for name in PORTAL_SERVICES:
        assert "smtp_password" in compose["services"][name]["secrets"], name
    example = (ROOT / "deploy" / "portal.env.example").read_text()
    assert "# EMAIL_HOST_PASSWORD_FILE=/run/secrets/smtp_password" in example


def test_it_runs_a_real_nodes_agent_in_the_agent_profile_through_the_proxy():
    agent = _compose()["services"]["agent"]
    assert agent["profiles"] == ["agent"]
    assert "python -m agents --portal https://${PORTAL_HOST}" in agent["command"]
    assert "--session-host ${AGENT_SESSION_HOST" in agent["command"]
    assert agent["network_mode"] == "host" and agent["pid"] == "host"
    gpus = agent["deploy"]["resources"]["reservations"]["devices"]
    assert gpus == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]


# Compose's interpolation, as the Compose Specification defines it: ${NAME}, ${NAME:-default},
# ${NAME-default}, ${NAME:?error} (unset or empty) and ${NAME?error} (unset), $$ for a dollar.
_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-?])([^}]*))?\}")


class Refused(Exception):
    """What `docker compose` stops with: a required variable is missing."""


def _interpolate(value, env: dict[str, str]):
    if isinstance(value, dict):
        return {key: _interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [_interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match[0] == "$$":
            return "$"
        name, colon, kind, word = match[1], match[2], match[3], match[4] or ""
        missing = name not in env or (colon and env[name] == "")
        if kind == "?" and missing:
            raise Refused(f"required variable {name} is missing a value: {word}")
        return word if missing and kind == "-" else env.get(name, "")

    return _VARIABLE.sub(one, value)


SITE = {
    "PORTAL_HOST": "gpus.example.org",
    "POSTGRES_PASSWORD": "0wner0wner",
    "PORTAL_APP_DB_PASSWORD": "app0app0",
    "REDIS_PASSWORD_FILE": "/etc/gpu-portal/redis-password",
}


@pytest.mark.parametrize(
    "unset", ["POSTGRES_PASSWORD", "PORTAL_APP_DB_PASSWORD", "REDIS_PASSWORD_FILE"]
)
@pytest.mark.parametrize("empty", [False, True])
def test_it_refuses_to_start_without_the_database_and_redis_passwords(unset, empty):
    env = {k: v for k, v in SITE.items() if k != unset} | ({unset: ""} if empty else {})
    with pytest.raises(Refused, match=f"{unset} is missing a value: set {unset}, "):
        _interpolate(_compose(), env)


def test_it_connects_with_the_passwords_the_site_gives_and_no_others():
    services = _interpolate(_compose(), SITE)["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "0wner0wner"
    assert services["postgres"]["environment"]["PORTAL_APP_DB_PASSWORD"] == "app0app0"
    assert services["migrate"]["environment"]["DATABASE_URL"] == (
        "postgres://portal:0wner0wner@postgres:5432/portal"
    )
    for name in ("web", "pass-worker", "worker", "beat", "simnode"):
        environment = services[name]["environment"]
        assert environment["DATABASE_URL"] == "postgres://portal_app:app0app0@postgres:5432/portal"
        assert environment["REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password", name
        assert "redis_password" in services[name]["secrets"], name
    assert "redis_password" in services["migrate"]["secrets"]


def _redis_config(tmp_path: Path, secret: Path) -> Path:
    """The config file the redis service writes at start, written by its own command."""
    command = _compose()["services"]["redis"]["command"]
    assert command[:2] == ["sh", "-c"]
    write = command[2].split(" > /tmp/redis.conf")[0]
    script = write.replace("$$", "$").replace("/run/secrets/redis_password", str(secret))
    config = tmp_path / "redis.conf"
    subprocess.run(["sh", "-c", f"{script} > {config}"], check=True)
    return config


@pytest.fixture
def redis_of_the_compose_file(tmp_path):
    """redis-server with the compose file's config, on a free loopback port."""
    if not shutil.which("redis-server"):
        pytest.skip("needs redis-server")
    secret = tmp_path / "redis-password"
    secret.write_text("p@ss:w/rd%x y\n")  # characters a URL must quote, a space, a newline
    config = _redis_config(tmp_path, secret)
    port = free_port()
    with config.open("a") as f:
        f.write(f'port {port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {tmp_path}\n')
    server = subprocess.Popen(["redis-server", str(config)], stdout=subprocess.DEVNULL)
    try:
        yield port, secret
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_it_gives_redis_a_password_that_the_portal_connects_with(redis_of_the_compose_file):
    import redis

    port, secret = redis_of_the_compose_file
    anonymous = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(50):
        try:
            anonymous.ping()
        except redis.exceptions.AuthenticationError:
            break  # up, and it wants the password
        except redis.exceptions.ConnectionError:
            time.sleep(0.1)
    else:
        pytest.fail("redis-server answered without a password")
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        DEBUG="1",
        REDIS_URL=f"redis://127.0.0.1:{port}/0",
        REDIS_PASSWORD_FILE=str(secret),
    )
    code = (
        "import django; django.setup(); from django.conf import settings; print(settings.REDIS_URL)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert redis.Redis.from_url(done.stdout.strip()).ping() is True
    healthcheck = _compose()["services"]["redis"]["healthcheck"]["test"]
    assert healthcheck[0] == "CMD-SHELL" and "REDISCLI_AUTH=" in healthcheck[1]


def test_it_refuses_a_redis_password_given_twice():
    from portal.env import SettingError, url_with_password

    with pytest.raises(SettingError, match="REDIS_URL has a password and one is given apart"):
        url_with_password("REDIS_URL", "redis://:one@redis:6379/0", "two")
