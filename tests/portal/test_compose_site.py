"""docker-compose.yml can configure a real site: it is a valid Compose file (the Compose
Specification's JSON schema, vendored in tests/data/), every setting the docs name reaches the
portal's containers through the env file, Caddy in front carries TLS and websockets, and only
the proxy publishes ports."""

import json
import os
import re
from pathlib import Path

import jsonschema
import yaml

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
