"""Celery application: workers run the allocator and side effects (see the beat schedule)."""

import os

from celery import Celery
from celery.signals import worker_ready

from portal.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
# Celery reads the settings lazily, deep in its start: load them now, so a bad one is one line.
settings_or_exit()

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["portal"])


@worker_ready.connect
def _heartbeat(sender, **kwargs) -> None:
    from portal.worker_heartbeat import heartbeat_start

    heartbeat_start([queue.name for queue in sender.task_consumer.queues])
