"""The allocation pass has a Celery queue of its own, so a flood of notification work (deliveries,
alert messages, outbox dispatch) never stands in front of it: their workers are apart too."""

from django.conf import settings

from portal.celery import app


def _queue(task: str) -> str:
    app.loader.import_default_modules()
    return app.amqp.router.route({}, task)["queue"].name


def test_it_routes_the_pass_to_its_own_queue_and_notification_work_to_the_other():
    assert _queue("portal.tasks.allocation_pass") == settings.CELERY_PASS_QUEUE
    for task in ("delivery_send", "node_alert_notify", "outbox_dispatch", "notifications_scan"):
        assert _queue(f"portal.tasks.{task}") == settings.CELERY_TASK_DEFAULT_QUEUE
    assert settings.CELERY_PASS_QUEUE != settings.CELERY_TASK_DEFAULT_QUEUE
