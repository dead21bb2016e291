"""Test settings: the real settings, on PostgreSQL and Redis (never SQLite for the suite)."""

import os

os.environ.setdefault("DEBUG", "1")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")

from portal.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
WHITENOISE_USE_FINDERS = True
STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}  # noqa: F405
SCHEDULER_PASS_INTERVAL_S = 3600.0
STATIC_ROOT.mkdir(parents=True, exist_ok=True)  # noqa: F405
