"""Requests made at once from threads, for the race tests (real PostgreSQL, transaction=True)."""

import threading

from django.db import connection
from rest_framework.test import APIClient


def post_at_once(users, path: str, body: dict) -> list[int]:
    """Each user POSTs ``body`` to ``path`` at the same moment (a barrier); the status codes."""
    barrier = threading.Barrier(len(users))
    statuses: list[int] = []

    def submit(user):
        client = APIClient()
        client.force_authenticate(user)
        barrier.wait()
        statuses.append(client.post(path, body, format="json").status_code)
        connection.close()

    threads = [threading.Thread(target=submit, args=(user,)) for user in users]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses
