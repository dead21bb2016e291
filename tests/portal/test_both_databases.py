"""The scheduling scenarios (marker both_databases) on SQLite too, inside the one pytest run.

The suite runs on PostgreSQL; the embedded default mode runs on SQLite. This runs the marked
tests again in a pytest of their own on SQLite (TEST_DATABASE=sqlite, portal/settings_test.py)
and fails with its output if any fails there, so a divergence between the two fails CI.
Redis stays as in the suite (cache, channel layer); only the database changes.
"""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.db import connection


def test_it_passes_the_scheduling_scenarios_on_sqlite_as_well():
    if connection.vendor == "sqlite":
        pytest.skip("this run is the SQLite one already")
    env = {**os.environ, "TEST_DATABASE": "sqlite"}
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "both_databases"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "deselected" in done.stdout, done.stdout[-2000:]
