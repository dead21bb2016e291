from django.db import connection


def test_it_runs_the_suite_on_postgresql(db):
    assert connection.vendor == "postgresql"


def test_it_takes_the_test_database_name_from_the_environment():
    import os
    import subprocess
    import sys

    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.DATABASES['default']['TEST']['NAME'])"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "portal.settings_test"}
    env["TEST_DATABASE_NAME"] = "test_gpuportal_from_env"
    named = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert named.stdout.strip() == "test_gpuportal_from_env", named.stderr
    env.pop("TEST_DATABASE_NAME")
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert default.stdout.strip().startswith("test_gpuportal_"), default.stderr
    assert default.stdout.strip() != "test_gpuportal_from_env"


def test_it_refuses_an_all_digit_password():
    import pytest
    from django.contrib.auth.password_validation import validate_password
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="entirely numeric"):
        validate_password("83749201938475")
    validate_password("gpu-demo-2026")
