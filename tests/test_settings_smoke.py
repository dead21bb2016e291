from django.db import connection


def test_it_runs_the_suite_on_postgresql(db):
    assert connection.vendor == "postgresql"
