"""Celery application: workers run the allocator and side effects (see the beat schedule)."""

import os

from celery import Celery
from celery.signals import worker_ready

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
# Read when Celery first needs its configuration (portal.celery_config: a bad setting is one line).
app.config_from_object("portal.celery_config:settings", namespace="CELERY")
app.autodiscover_tasks(["portal"])


@worker_ready.connect
def _heartbeat(sender, **kwargs) -> None:
    from portal.worker_heartbeat import heartbeat_start

    heartbeat_start([queue.name for queue in sender.task_consumer.queues])
