"""`manage.py serve`: the portal's HTTP and websockets on one port, on several worker processes.

Server mode (REDIS_URL set: the channel layer spans processes) runs WEB_WORKERS uvicorn workers;
embedded mode runs one, in this process. `manage.py up` serves through the same function.
"""

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve the portal (HTTP and websockets) with uvicorn on WEB_WORKERS processes."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--workers", type=int, help="Default: WEB_WORKERS (server mode).")

    def handle(self, *args, host, port, workers, **options):
        serve(host=host, port=port, workers=workers or web_workers())


def web_workers() -> int:
    """WEB_WORKERS where the channel layer spans processes (Redis); one process otherwise."""
    return settings.WEB_WORKERS if settings.REDIS_URL else 1


def serve(*, host: str, port: int, workers: int) -> None:
    """Run uvicorn until SIGTERM/SIGINT. Several workers are its own supervised processes.

    Request lines (uvicorn's access log) are debug-level: only with LOG_LEVEL=DEBUG.
    """
    import uvicorn

    debug = settings.LOGGING["root"]["level"].upper() == "DEBUG"

    uvicorn.run(
        "portal.asgi:application",
        host=host,
        port=port,
        workers=workers,
        # Django has no lifespan events; the client address is the socket's (forwarded headers are
        # read by the login throttle per TRUSTED_PROXY_COUNT and by Django's SECURE_PROXY_SSL_HEADER).
        lifespan="off",
        proxy_headers=False,
        access_log=debug,
        log_level="debug" if debug else "warning",
        backlog=4096,
        # Live messages are small JSON sent to hundreds of sockets a second: compressing each one
        # for each socket is CPU spent per socket for a few hundred bytes saved.
        ws_per_message_deflate=False,
        # Open websockets would otherwise hold a stop for as long as the browsers stay.
        timeout_graceful_shutdown=5,
    )
