"""GPU Portal settings, driven by environment variables.

Embedded default (no DATABASE_URL / REDIS_URL): SQLite, in-process channel layer, local-memory
cache and an in-process scheduler loop. With DATABASE_URL and REDIS_URL set: PostgreSQL, Redis as
channel layer, cache and Celery broker.
"""

import re
from pathlib import Path

import dj_database_url

from portal.env import (
    SettingError,
    env,
    envbool,
    envchoice,
    envfloat,
    envimagesources,
    envint,
    envlist,
    envnetworks,
    envrange,
    envurl,
    url_problem,
    url_with_password,
)
from portal.headers import policy_header
from portal.job_env import port_range_parse, signal_parse
from portal.notify_env import notify_settings
from portal.policy_env import PRESET_ENV, policy_env_names, policy_settings
from portal.sso.config import sign_in_settings

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env("PORTAL_VAR_DIR", str(BASE_DIR / "var")))


def _var_dir_make() -> None:
    try:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingError(f"PORTAL_VAR_DIR={str(VAR_DIR)!r}: cannot create it ({exc})") from None


# Every setting is read by one helper of portal.env that checks it (a range, a choice, a URL's
# scheme and shape): a bad value stops the start with one line, "Bad setting: NAME=...".
# PostgreSQL (server mode) or SQLite; Redis over TCP, TLS or a Unix socket.
DATABASE_URL = envurl(
    "DATABASE_URL",
    "",
    schemes=("postgres", "postgresql", "sqlite"),
    host_or_path=("postgres", "postgresql", "sqlite"),
)
# The password may come apart from the URL (REDIS_PASSWORD_FILE: the compose secret).
REDIS_URL = url_with_password(
    "REDIS_URL",
    envurl("REDIS_URL", "", schemes=("redis", "rediss", "unix"), host_or_path=("unix",)),
    env("REDIS_PASSWORD"),
)
# Embedded mode: the one-command demo on a laptop (SQLite, in-process loop, plain http on
# localhost). Server mode: PostgreSQL behind a TLS-terminating proxy.
EMBEDDED = not DATABASE_URL
DEBUG = envbool("DEBUG", "False")


def _secret_key() -> str:
    key = env("SECRET_KEY")
    if key:
        return key
    if DEBUG:
        return "insecure-dev-key-" + "x" * 40
    if not EMBEDDED:
        raise SettingError("Set SECRET_KEY (or SECRET_KEY_FILE) in server mode.")
    # The embedded demo makes its own key once and keeps it beside its database.
    import secrets

    path = VAR_DIR / "secret_key"
    _var_dir_make()
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS")
for _origin in CSRF_TRUSTED_ORIGINS:
    if url_problem(_origin, schemes=("https", "http")):
        raise SettingError(
            f"CSRF_TRUSTED_ORIGINS: {_origin!r} is no origin: expected e.g. https://gpu.example.org"
        )
# The address in mails and Slack messages (links are SITE_URL + "/bookings/..."): http(s), a host.
SITE_URL = envurl("SITE_URL", "http://127.0.0.1:8000", schemes=("https", "http")).rstrip("/")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "portal",
]

MIDDLEWARE = [
    "portal.middleware.QueueWaitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "portal.headers.SecurityHeadersMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "portal.middleware.DependencyDownMiddleware",
]

# Scripts, styles and everything else from this site only; no inline code, no eval
# (portal/headers.py). The websocket is same-origin, which 'self' covers.
CONTENT_SECURITY_POLICY = policy_header(
    {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
)
# Powerful browser features the portal never uses, off for it and anything it might embed.
PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


# Serving (server mode): HTTP and websockets on one port, on WEB_WORKERS uvicorn processes, each
# running Django's HTTP views on WEB_THREADS threads (portal.wsgi_threads). The Python interpreter
# runs one thread's Python at a time, so processes use the cores and threads overlap the waits on
# PostgreSQL. Embedded mode serves from one process (its channel layer is in-process).
def _default_web_workers() -> int:
    import os

    return min(max(2 * (os.cpu_count() or 1), 2), 16)


WEB_WORKERS = envint("WEB_WORKERS", _default_web_workers(), low=1, high=256)
WEB_THREADS = envint("WEB_THREADS", 4, low=1, high=64)
# Backpressure, per worker process: at most WEB_MAX_INFLIGHT requests admitted at once (the rest
# get 503 + Retry-After at once), and an admitted request that waited WEB_QUEUE_WAIT_S before its
# view could start gets 503 too, so the latency of those served stays bounded under overload.
WEB_MAX_INFLIGHT = envint("WEB_MAX_INFLIGHT", 8, low=1, high=10_000)
WEB_QUEUE_WAIT_S = envfloat("WEB_QUEUE_WAIT_S", 0.25, low=0.001, high=60)
WEB_RETRY_AFTER_S = envint("WEB_RETRY_AFTER_S", 1, low=1, high=3600)

# PostgreSQL connections come from a pool in each process (psycopg_pool), so the connections a
# site opens are bounded (a web worker uses one per busy HTTP thread, plus its websockets' brief
# lookups): web workers x DB_POOL_MAX_SIZE, plus the Celery worker's and beat's, must
# stay under PostgreSQL's max_connections (100 by default). A request that waits DB_POOL_TIMEOUT_S
# for a connection answers 503 with Retry-After (portal.middleware), never 500. Under ASGI a
# persistent connection (CONN_MAX_AGE) would be opened per request and kept, so the pool replaces it.
DB_POOL_MIN_SIZE = envint("DB_POOL_MIN_SIZE", 1, low=0, high=1000)
DB_POOL_MAX_SIZE = envint("DB_POOL_MAX_SIZE", 8, low=1, high=1000)
DB_POOL_TIMEOUT_S = envfloat("DB_POOL_TIMEOUT_S", 2.0, low=0.001, high=60)
if DB_POOL_MIN_SIZE > DB_POOL_MAX_SIZE:
    raise SettingError(
        "DB_POOL_MIN_SIZE and DB_POOL_MAX_SIZE need 0 <= min <= max, max >= 1 "
        f"(got DB_POOL_MIN_SIZE={DB_POOL_MIN_SIZE}, DB_POOL_MAX_SIZE={DB_POOL_MAX_SIZE})."
    )


def _database(url: str) -> dict:
    # With the pool, CONN_HEALTH_CHECKS makes Django hand the pool its connection check: one that
    # PostgreSQL dropped (restart, pg_terminate_backend) is replaced before a request gets it.
    try:
        return dj_database_url.parse(url, conn_max_age=0, conn_health_checks=True)
    except ValueError as exc:  # e.g. a port that is no number
        raise SettingError(f"DATABASE_URL: not a database address ({exc})") from None


if DATABASE_URL:
    DATABASES = {"default": _database(DATABASE_URL)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": DB_POOL_MIN_SIZE,
            "max_size": DB_POOL_MAX_SIZE,
            "timeout": DB_POOL_TIMEOUT_S,
        }
else:
    _var_dir_make()
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "portal.sqlite3",
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, the same as channels_redis's
            # BRPOP wait: idle consumers then die with "Timeout reading". Wait longer than BRPOP.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Notifications and idle reclaim (docs/notifications.md), read and validated by portal.notify_env.
_notify = notify_settings()
SLACK_BOT_TOKEN = _notify["SLACK_BOT_TOKEN"]
SLACK_SIGNING_SECRET = _notify["SLACK_SIGNING_SECRET"]
SLACK_API_URL = _notify["SLACK_API_URL"]
NOTIFY_DEFAULT_EVENTS = _notify["NOTIFY_DEFAULT_EVENTS"]
NOTIFY_DEFAULT_CHANNELS = _notify["NOTIFY_DEFAULT_CHANNELS"]
NOTIFY_SEND_TIMEOUT_S = _notify["NOTIFY_SEND_TIMEOUT_S"]
NOTIFY_MAX_ATTEMPTS = _notify["NOTIFY_MAX_ATTEMPTS"]
NOTIFY_RETRY_BACKOFF_S = _notify["NOTIFY_RETRY_BACKOFF_S"]
NOTIFY_ACTION_TTL_S = _notify["NOTIFY_ACTION_TTL_S"]
NOTIFY_STARTING_SOON_MIN = _notify["NOTIFY_STARTING_SOON_MIN"]
NOTIFY_ENDING_SOON_MIN = _notify["NOTIFY_ENDING_SOON_MIN"]
NOTIFY_MOVED_THRESHOLD_MIN = _notify["NOTIFY_MOVED_THRESHOLD_MIN"]
NOTIFY_BUDGET_FRACTION = _notify["NOTIFY_BUDGET_FRACTION"]
NOTIFY_SCAN_INTERVAL_S = _notify["NOTIFY_SCAN_INTERVAL_S"]
IDLE_RECLAIM_ENABLED = _notify["IDLE_RECLAIM_ENABLED"]
IDLE_UTIL_THRESHOLD = _notify["IDLE_UTIL_THRESHOLD"]
IDLE_MINUTES = _notify["IDLE_MINUTES"]
IDLE_GRACE_MINUTES = _notify["IDLE_GRACE_MINUTES"]
IDLE_MEMORY_MIB = _notify["IDLE_MEMORY_MIB"]
NOTIFY_ALLOW_HTTP = _notify["NOTIFY_ALLOW_HTTP"]
NOTIFY_ALLOWED_NETWORKS = _notify["NOTIFY_ALLOWED_NETWORKS"]

# Celery: with REDIS_URL a worker and beat run the allocator; without, `manage.py up` runs the
# same pass in-process (CELERY_TASK_ALWAYS_EAGER keeps .delay() calls synchronous).
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_TIMEZONE = "UTC"
SCHEDULER_PASS_INTERVAL_S = envfloat("SCHEDULER_PASS_INTERVAL_S", 5.0, low=0.1, high=3600)
# The allocation pass has a queue of its own, served by a worker of its own (`manage.py up`
# starts one): a flood of notification work never stands in front of a pass.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_PASS_QUEUE = env("CELERY_PASS_QUEUE", "allocation").strip() or "allocation"
if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", CELERY_PASS_QUEUE):
    raise SettingError(
        f"CELERY_PASS_QUEUE={CELERY_PASS_QUEUE!r}: expected a queue name (letters, digits, . _ -)"
    )
CELERY_TASK_ROUTES = {"portal.tasks.allocation_pass": {"queue": CELERY_PASS_QUEUE}}
# Changes ask for a pass at most once per this many seconds (a burst of submissions gives a few
# passes, each seeing all of them); 0 runs one pass per change.
SCHEDULER_PASS_COALESCE_S = envfloat("SCHEDULER_PASS_COALESCE_S", 1.0, low=0, high=60)
# Under SCHEDULER_FAIRSHARE_CHARGE=measured or blend, how long the running allocations' measured
# utilization is reused between passes (reading it costs a scan of their minute rollups).
FAIRSHARE_LIVE_UTILIZATION_CACHE_S = envfloat(
    "FAIRSHARE_LIVE_UTILIZATION_CACHE_S", 60.0, low=0, high=3600
)
# Every periodic job, one line each.
CELERY_BEAT_SCHEDULE = {
    # Start due reservations, end finished bookings, plan and start the queue.
    "allocation-pass": {
        "task": "portal.tasks.allocation_pass",
        "schedule": SCHEDULER_PASS_INTERVAL_S,
    },
    # Roll raw telemetry up into per-minute rows, then prune both past their retention.
    "telemetry-rollup": {
        "task": "portal.tasks.telemetry_rollup",
        "schedule": envfloat("TELEMETRY_ROLLUP_INTERVAL_S", 60.0, low=1, high=86400),
    },
    # Mark nodes whose agent stopped reporting as down; fail or requeue their bookings.
    "node-heartbeat-check": {
        "task": "portal.tasks.node_heartbeat_check",
        "schedule": envfloat("NODE_HEARTBEAT_CHECK_INTERVAL_S", 15.0, low=1, high=86400),
    },
    # Starting soon, ending soon, planned start moved, budget nearly used; resend stuck deliveries.
    "notifications-scan": {
        "task": "portal.tasks.notifications_scan",
        "schedule": NOTIFY_SCAN_INTERVAL_S,
    },
    # Send the facts left undispatched after commit (a process died, a subscriber failed).
    "outbox-sweep": {
        "task": "portal.tasks.outbox_sweep",
        "schedule": envfloat("OUTBOX_SWEEP_INTERVAL_S", 30.0, low=1, high=86400),
    },
    # Warn bookings whose devices sit idle; release those nobody kept (IDLE_RECLAIM_ENABLED).
    "idle-reclaim": {
        "task": "portal.tasks.idle_reclaim",
        "schedule": envfloat("IDLE_RECLAIM_INTERVAL_S", 60.0, low=1, high=86400),
    },
    # Drain the nodes of maintenance windows under way; return those of windows over.
    "maintenance-cycle": {
        "task": "portal.tasks.maintenance_cycle",
        "schedule": 15.0,
    },
}

# Container images a booking may name (docs/containers.md): allowed sources, comma-separated,
# e.g. "docker://nvcr.io/nvidia,/shared/images" (hosts as hosts, repositories and directories
# by whole path segments: agents/images.py). Empty: no images at all.
CONTAINER_IMAGE_SOURCES = envimagesources("CONTAINER_IMAGE_SOURCES")
# Options `manage.py up` adds to each of its simulated demo agents' command lines (shell words),
# e.g. the container runtime's options a machine needs: "--container-runtime podman
# --container-arg podman=--runtime=/usr/sbin/runc" (docs/containers.md, "In the demo").
DEMO_AGENT_ARGS = env("DEMO_AGENT_ARGS", "")

# Operators' endpoints (portal/web/ops.py): /metrics answers loopback, these networks (CIDR,
# comma-separated) and `Authorization: Bearer METRICS_TOKEN`; /readyz wants a pass this recent.
METRICS_TOKEN = env("METRICS_TOKEN")
METRICS_ALLOWED_NETWORKS = envnetworks("METRICS_ALLOWED_NETWORKS")
READY_PASS_MAX_AGE_S = envfloat(
    "READY_PASS_MAX_AGE_S", max(60.0, 12 * SCHEDULER_PASS_INTERVAL_S), low=1, high=86400
)
# /readyz in server mode: a worker consuming CELERY_PASS_QUEUE has said so this recently.
READY_WORKER_MAX_AGE_S = envfloat(
    "READY_WORKER_MAX_AGE_S", SCHEDULER_PASS_INTERVAL_S, low=0.1, high=86400
)

# Interactive sessions (docs/interactive.md): the proxy connects only to the address a node
# registered from (or these networks) and to ports in SESSION_PORTS, the range agents pick
# session ports from (the kernel's ephemeral range, net.ipv4.ip_local_port_range, by default).
SESSION_ALLOWED_NETWORKS = envnetworks("SESSION_ALLOWED_NETWORKS")
SESSION_PORTS = envrange("SESSION_PORTS", "32768-60999", low=1, high=65535)

# Node agents: what the portal tells them at register, and when a silent node counts as down.
AGENT_REPORT_INTERVAL_S = envfloat("AGENT_REPORT_INTERVAL_S", 5.0, low=0.1, high=3600)
AGENT_SYNC_INTERVAL_S = envfloat("AGENT_SYNC_INTERVAL_S", 30.0, low=0.1, high=3600)
AGENT_ENFORCEMENT = envchoice("AGENT_ENFORCEMENT", "report", ("report", "warn", "kill"))
# MIG layouts the allocator proposes (docs/scheduling.md, "MIG layouts that change"): "off"
# (the default), "propose" (staff approve each in /admin/ or the API) or "apply" (approved at
# once), when MIG bookings have waited MIG_AUTO_LAYOUT_WAIT_S for a profile no idle GPU offers.
MIG_AUTO_LAYOUT = envchoice("MIG_AUTO_LAYOUT", "off", ("off", "propose", "apply"))
MIG_AUTO_LAYOUT_WAIT_S = envfloat("MIG_AUTO_LAYOUT_WAIT_S", 3600.0, low=0, high=30 * 86400)
NODE_HEARTBEAT_TIMEOUT_S = envfloat("NODE_HEARTBEAT_TIMEOUT_S", 60.0, low=1, high=86400)
if NODE_HEARTBEAT_TIMEOUT_S <= AGENT_REPORT_INTERVAL_S:
    raise SettingError(
        f"NODE_HEARTBEAT_TIMEOUT_S={NODE_HEARTBEAT_TIMEOUT_S:g} must be longer than "
        f"AGENT_REPORT_INTERVAL_S={AGENT_REPORT_INTERVAL_S:g}, or every node counts as down."
    )
# Times in readings and events more than this far ahead of the portal's clock are refused (400
# naming the field); old ones are kept (an agent sends what it queued while the portal was away)
# and pruned by the telemetry retention like any.
AGENT_CLOCK_SKEW_S = envfloat("AGENT_CLOCK_SKEW_S", 300.0, low=0, high=86400)
# One message per node and alert kind at most this often; the other alerts are rows to read.
NODE_ALERT_COALESCE_S = envfloat("NODE_ALERT_COALESCE_S", 300.0, low=0, high=86400)
# A booked device is "in use" (not just "booked") from a reading at or above IN_USE_UTIL_ON %
# utilization until one at or below IN_USE_UTIL_OFF %, over its readings of the last
# IN_USE_WINDOW_S seconds (hysteresis: idle noise around a few percent does not flip it).
IN_USE_UTIL_ON = envfloat("IN_USE_UTIL_ON", 10.0)
IN_USE_UTIL_OFF = envfloat("IN_USE_UTIL_OFF", 3.0)
IN_USE_WINDOW_S = envfloat("IN_USE_WINDOW_S", 60.0)
if not 0 <= IN_USE_UTIL_OFF < IN_USE_UTIL_ON <= 100:
    raise SettingError(
        "IN_USE_UTIL_OFF and IN_USE_UTIL_ON must be percentages with OFF below ON "
        f"(got OFF={IN_USE_UTIL_OFF}, ON={IN_USE_UTIL_ON})."
    )
if not 0 < IN_USE_WINDOW_S <= 3600:
    raise SettingError(
        f"IN_USE_WINDOW_S must be between 0 and 3600 seconds (not 0), not {IN_USE_WINDOW_S:g}."
    )
# A running batch job's output (the agent sends its tail when it grew, once per report): the
# portal stores and broadcasts at most one per booking this often (a guard against a chatty agent).
BOOKING_OUTPUT_MIN_INTERVAL_S = envfloat("BOOKING_OUTPUT_MIN_INTERVAL_S", 2.0, low=0, high=3600)
REQUEUE_ON_NODE_FAILURE = envbool("REQUEUE_ON_NODE_FAILURE", "True")
# Batch jobs (docs/distributed.md): the signal a booking gets before its end when it names none
# (Slurm's --signal, e.g. USR1@120; blank: none), the seconds from SIGTERM to SIGKILL (Slurm's
# KillWait), and the ports the portal hands out as MASTER_PORT (keep them free on the nodes).
JOB_SIGNAL_DEFAULT = env("JOB_SIGNAL_DEFAULT", "").strip()
if JOB_SIGNAL_DEFAULT:
    try:
        signal_parse(JOB_SIGNAL_DEFAULT)
    except ValueError as _exc:
        raise SettingError(f"JOB_SIGNAL_DEFAULT={JOB_SIGNAL_DEFAULT!r}: {_exc}") from None
JOB_KILL_WAIT_S = envint("JOB_KILL_WAIT_S", 30)
if not 0 <= JOB_KILL_WAIT_S <= 3600:
    raise SettingError(
        f"JOB_KILL_WAIT_S must be between 0 and 3600 seconds, not {JOB_KILL_WAIT_S}."
    )
try:
    JOB_MASTER_PORTS = port_range_parse(env("JOB_MASTER_PORTS", "29500-29999"))
except ValueError as _exc:
    raise SettingError(f"JOB_MASTER_PORTS={env('JOB_MASTER_PORTS')!r}: {_exc}") from None
# Telemetry history: raw samples for hours, per-minute rollups for days.
# At least an hour of raw samples: the rollup recomputes its last minutes from them.
TELEMETRY_RAW_RETENTION_H = envfloat("TELEMETRY_RAW_RETENTION_H", 24.0, low=1, high=24 * 366)
TELEMETRY_ROLLUP_RETENTION_D = envfloat("TELEMETRY_ROLLUP_RETENTION_D", 30.0, low=1, high=3660)
# Allocator policy: scheduler.Policy's defaults (the ones the trace replay measures, see
# docs/scheduling.md); every field overridable as SCHEDULER_<FIELD> and validated here.
# SCHEDULER_PRESET=<name> starts from a named reference policy (scheduler/presets.py).
_POLICY_NAMES = [*policy_env_names().values(), PRESET_ENV]
SCHEDULER_POLICY = policy_settings({n: env(n) for n in _POLICY_NAMES if env(n)})
# Cores and host memory booked with GPUs (docs/scheduling.md, "Cores and memory"), on nodes
# whose agents report them; off, the allocator, the agents' limits and the pages count GPUs
# alone and a request naming cores or memory is refused.
SCHEDULE_CORES_MEMORY = envbool("SCHEDULE_CORES_MEMORY", "True")
# Cores and host memory per GPU of a booking that names none: SCHEDULER_DEFAULT_CPUS_PER_GPU and
# SCHEDULER_DEFAULT_MEMORY_MIB_PER_GPU, policy fields like the others (docs/scheduling.md, "Cores
# and memory"); unset: the node's share in proportion to the GPUs booked.
# Elastic quotas (docs/scheduling.md, "Borrowing"): whether a quota that does not say lets its
# bookings borrow past max_gpus; a reclaimed booking's warning (the kill wait) comes out of
# SCHEDULER_RECLAIM_GRACE_S unless SCHEDULER_RECLAIM_WARNING_S says otherwise.
QUOTA_BORROWING = envbool("QUOTA_BORROWING", "False")
SCHEDULER_POLICY.setdefault("reclaim_warning_s", float(JOB_KILL_WAIT_S))
_reclaim = {k: SCHEDULER_POLICY.get(k, 300.0) for k in ("reclaim_grace_s", "reclaim_warning_s")}
if not _reclaim["reclaim_warning_s"] <= _reclaim["reclaim_grace_s"]:
    raise SettingError(
        f"SCHEDULER_RECLAIM_GRACE_S={_reclaim['reclaim_grace_s']:g} must be at least the warning"
        f" a reclaimed booking gets (SCHEDULER_RECLAIM_WARNING_S, else JOB_KILL_WAIT_S:"
        f" {_reclaim['reclaim_warning_s']:g} s)."
    )

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# --- Signing in (docs/authentication.md) ---------------------------------------------------
# Local passwords (LOCAL_LOGIN_ENABLED), OpenID Connect (on with OIDC_RP_CLIENT_ID) and LDAP (on
# with LDAP_SERVER_URI), read and validated by portal.sso.config. The OIDC_* and LDAP_*
# settings exist only when their way in is on (mozilla-django-oidc expects that).
_sign_in = sign_in_settings(env)
LOCAL_LOGIN_ENABLED = _sign_in["LOCAL_LOGIN_ENABLED"]
AUTHENTICATION_BACKENDS = _sign_in["AUTHENTICATION_BACKENDS"]
OIDC_ENABLED = _sign_in["OIDC_ENABLED"]
OIDC_PROVIDER_NAME = _sign_in["OIDC_PROVIDER_NAME"]
LOGIN_REDIRECT_URL_FAILURE = _sign_in["LOGIN_REDIRECT_URL_FAILURE"]
LDAP_ENABLED = _sign_in["LDAP_ENABLED"]
if OIDC_ENABLED:
    OIDC_RP_CLIENT_ID = _sign_in["OIDC_RP_CLIENT_ID"]
    OIDC_RP_CLIENT_SECRET = _sign_in["OIDC_RP_CLIENT_SECRET"]
    OIDC_RP_SIGN_ALGO = _sign_in["OIDC_RP_SIGN_ALGO"]
    OIDC_RP_SCOPES = _sign_in["OIDC_RP_SCOPES"]
    OIDC_OP_AUTHORIZATION_ENDPOINT = _sign_in["OIDC_OP_AUTHORIZATION_ENDPOINT"]
    OIDC_OP_TOKEN_ENDPOINT = _sign_in["OIDC_OP_TOKEN_ENDPOINT"]
    OIDC_OP_USER_ENDPOINT = _sign_in["OIDC_OP_USER_ENDPOINT"]
    OIDC_OP_JWKS_ENDPOINT = _sign_in["OIDC_OP_JWKS_ENDPOINT"]
    OIDC_GROUPS_CLAIM = _sign_in["OIDC_GROUPS_CLAIM"]
    OIDC_USERNAME_CLAIM = _sign_in["OIDC_USERNAME_CLAIM"]
    OIDC_CREATE_USER = _sign_in["OIDC_CREATE_USER"]
    OIDC_VERIFY_SSL = _sign_in["OIDC_VERIFY_SSL"]
    OIDC_TIMEOUT = _sign_in["OIDC_TIMEOUT"]
if LDAP_ENABLED:
    LDAP_SERVER_URI = _sign_in["LDAP_SERVER_URI"]
    LDAP_BIND_DN = _sign_in["LDAP_BIND_DN"]
    LDAP_BIND_PASSWORD = _sign_in["LDAP_BIND_PASSWORD"]
    LDAP_START_TLS = _sign_in["LDAP_START_TLS"]
    LDAP_USER_SEARCH_BASE = _sign_in["LDAP_USER_SEARCH_BASE"]
    LDAP_USER_SEARCH_FILTER = _sign_in["LDAP_USER_SEARCH_FILTER"]
    LDAP_GROUP_SEARCH_BASE = _sign_in["LDAP_GROUP_SEARCH_BASE"]
    LDAP_GROUP_TYPE = _sign_in["LDAP_GROUP_TYPE"]
    LDAP_TIMEOUT_S = _sign_in["LDAP_TIMEOUT_S"]
# --- end of signing in ----------------------------------------------------------------------
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env("TIME_ZONE", "UTC").strip() or "UTC"


def _check_time_zone(name: str) -> None:
    import zoneinfo

    try:
        zoneinfo.ZoneInfo(name)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise SettingError(
            f"TIME_ZONE={name!r}: expected a time zone name, e.g. Europe/Berlin"
        ) from None


_check_time_zone(TIME_ZONE)
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.js straight from the plotly package, as /static/vendor/plotly/plotly.min.js.
    "portal.web.staticfinders.PlotlyFinder",
]
STATIC_ROOT = Path(env("STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG

# How many reverse proxies in front of the site append to X-Forwarded-For. 0 (no proxy): the client
# address is REMOTE_ADDR and X-Forwarded-For is ignored; N: the Nth address from its right.
TRUSTED_PROXY_COUNT = envint("TRUSTED_PROXY_COUNT", 0, low=0, high=10)
# Failed logins (API token, login page, admin) allowed per client address and per username.
LOGIN_FAILURE_LIMIT = envint("LOGIN_FAILURE_LIMIT", 10, low=1, high=10_000)
LOGIN_FAILURE_WINDOW_S = envint("LOGIN_FAILURE_WINDOW_S", 300, low=1, high=7 * 86400)
# API token -> user lookups are cached this long; revoking a token or deactivating its user drops
# the cached entry at once (portal.api.auth), so this bounds only staleness of the user's fields.
TOKEN_CACHE_S = envint("TOKEN_CACHE_S", 30, low=0, high=3600)

# The audit log's CSV export (GET /api/v1/audit/?format=csv) holds at most this many rows;
# narrow the filters (from/to) for more.
AUDIT_EXPORT_MAX_ROWS = envint("AUDIT_EXPORT_MAX_ROWS", 100_000, low=1, high=10_000_000)
# POST bookings/estimate/ per user (the Book page asks as one types): "N/s", "N/min", "N/hour"
# or "N/day"; past it 429 with Retry-After. Queued requests are planned on a copy of the queue
# and its walk, used for ESTIMATE_SNAPSHOT_TTL_S seconds once ready and then while the next one
# is read and walked in the background (0: read it for every estimate).
ESTIMATE_RATE = env("ESTIMATE_RATE", "60/min").strip() or "60/min"
ESTIMATE_SNAPSHOT_TTL_S = envfloat("ESTIMATE_SNAPSHOT_TTL_S", 5.0, low=0, high=300)
if not re.fullmatch(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)", ESTIMATE_RATE):
    raise SettingError(
        f'ESTIMATE_RATE={ESTIMATE_RATE!r}: expected like "60/min", a positive count per s, '
        "min, h or day."
    )

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.api.auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "portal.api.pagination.OrderedPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "portal.api.errors.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"token": "10/minute", "estimate": ESTIMATE_RATE},
    # Rate limits key on the address the trusted proxies report, never on a client's own header.
    "NUM_PROXIES": TRUSTED_PROXY_COUNT,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Portal API",
    "DESCRIPTION": "Book whole GPUs and MIG slices; see inventory, queue and quotas.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Served from the sidecar package: sites are often air-gapped, so no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

EMAIL_BACKEND = env("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
# Where portal.mailbox.FolderEmailBackend (`manage.py up`'s default) keeps each message.
EMAIL_FILE_PATH = env("EMAIL_FILE_PATH", str(VAR_DIR / "mail"))
EMAIL_HOST = env("EMAIL_HOST", "localhost")
EMAIL_PORT = envint("EMAIL_PORT", 25, low=1, high=65535)
# SMTP authentication and encryption (the password may come from EMAIL_HOST_PASSWORD_FILE).
EMAIL_HOST_USER = env("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = envbool("EMAIL_USE_TLS", "False")  # STARTTLS, usually on port 587
EMAIL_USE_SSL = envbool("EMAIL_USE_SSL", "False")  # implicit TLS, usually on port 465
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise SettingError(
        "EMAIL_USE_TLS and EMAIL_USE_SSL are both on: choose one (587: TLS, 465: SSL)."
    )
EMAIL_TIMEOUT = envint("EMAIL_TIMEOUT", 30, low=1, high=3600)
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "gpu-portal@localhost")
# The site's Slack incoming webhook: admins' events (node down, foreign process).
SLACK_WEBHOOK_URL = envurl("SLACK_WEBHOOK_URL", "", schemes=("https", "http"))

# Portal policy knobs.
BOOKING_MAX_GPUS_PER_REQUEST = envint("BOOKING_MAX_GPUS_PER_REQUEST", 1024, low=1, high=65536)
BOOKING_MAX_DURATION_S = envint("BOOKING_MAX_DURATION_S", 30 * 86400, low=60, high=366 * 86400)
BOOKING_LOCK_TIMEOUT_MS = envint("BOOKING_LOCK_TIMEOUT_MS", 3000, low=1, high=60_000)

# The HTTPS-only settings are for a site behind a TLS-terminating proxy (docker-compose sets it).
# Without it, server mode serves plain http, e.g. the README's trial on http://127.0.0.1:8000.
BEHIND_TLS_PROXY = envbool("BEHIND_TLS_PROXY", "False")
if BEHIND_TLS_PROXY and not DEBUG:
    SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", "True")
    CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", "True")
    SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "True")
    # Paths (regexes, no leading slash) served over plain http too, e.g. ^api/v1/agent/ for
    # agents inside the compose network.
    SECURE_REDIRECT_EXEMPT = envlist("SECURE_REDIRECT_EXEMPT")
    for _pattern in SECURE_REDIRECT_EXEMPT:
        try:
            re.compile(_pattern)
        except re.error as _exc:
            raise SettingError(
                f"SECURE_REDIRECT_EXEMPT: {_pattern!r} is no regular expression ({_exc})"
            ) from None
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", 31536000, low=0, high=2 * 31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "False")
    # Joining the browsers' HSTS preload list is the site's decision, not the software's.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {
        "handlers": ["console"],
        "level": envchoice(
            "LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), upper=True
        ),
    },
}
