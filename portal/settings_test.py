"""Test settings: the real settings, on PostgreSQL and Redis.

TEST_DATABASE=sqlite puts the database on SQLite instead (Redis stays): the scheduling scenario
tests (marker both_databases) run that way too, so the embedded default mode schedules as server
mode does (tests/portal/test_both_databases.py runs them).
"""

import hashlib
import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")

from portal.settings import *  # noqa: E402,F403

# Checkouts side by side on one machine (worktrees, CI beside a developer) must not share a test
# database, cache keys or channel-layer groups.
TEST_RUN_ID = hashlib.sha1(str(BASE_DIR).encode()).hexdigest()[:8]  # noqa: F405
# TEST_DATABASE_NAME names the test database outright (CI beside a developer, a second run).
DATABASES["default"]["TEST"] = {  # noqa: F405
    "NAME": os.environ.get("TEST_DATABASE_NAME") or f"test_gpuportal_{TEST_RUN_ID}"
}
if os.environ.get("TEST_DATABASE") == "sqlite":
    DATABASES = {  # noqa: F811
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "var" / f"test_{TEST_RUN_ID}.sqlite3",  # noqa: F405
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
            "TEST": {"NAME": None},  # in memory, as pytest-django does for SQLite
        }
    }
CACHES["default"]["KEY_PREFIX"] = TEST_RUN_ID  # noqa: F405
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = f"asgi{TEST_RUN_ID}"  # noqa: F405

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Tests run tasks eagerly; a test that starts a real worker sets CELERY_WORKER_EAGER=0 for it.
CELERY_TASK_ALWAYS_EAGER = os.environ.get("CELERY_WORKER_EAGER", "1") == "1"
CELERY_TASK_DEFAULT_QUEUE = f"portal-test-{TEST_RUN_ID}"
CELERY_PASS_QUEUE = f"{CELERY_TASK_DEFAULT_QUEUE}-pass"
CELERY_TASK_ROUTES = {"portal.tasks.allocation_pass": {"queue": CELERY_PASS_QUEUE}}
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
WHITENOISE_USE_FINDERS = True
STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}  # noqa: F405
SCHEDULER_PASS_INTERVAL_S = 3600.0
# Tests see each change's pass at once; the coalescing test turns it on.
SCHEDULER_PASS_COALESCE_S = 0.0
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405
