"""ASGI entry point: HTTP through Django (its WSGI handler on threads), websockets through Channels.

/sessions/ (interactive sessions, HTTP and websockets) goes to the async reverse proxy.

Beyond capacity, HTTP requests are refused with 503 here, before they reach a thread.
"""

import os

from django.core.wsgi import get_wsgi_application

from portal.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
settings_or_exit()  # a bad setting: one line and exit 1, not a traceback per worker
django_wsgi_app = get_wsgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402

from portal.middleware import AdmissionLimit, DependencyDownAsgi  # noqa: E402
from portal.routing import (  # noqa: E402
    SESSION_HTTP_PREFIX,
    agent_websocket_urlpatterns,
    session_http_app,
    websocket_urlpatterns,
)
from portal.wsgi_threads import WsgiOnThreads  # noqa: E402

_browser_websockets = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
)
_agent_websockets = URLRouter(agent_websocket_urlpatterns)
_AGENT_PATHS = {"/" + str(p.pattern) for p in agent_websocket_urlpatterns}


async def _route_websockets(scope, receive, send):
    # Agents carry a node token and no Origin header: the origin check is for cookie sessions.
    app = _agent_websockets if scope["path"] in _AGENT_PATHS else _browser_websockets
    return await app(scope, receive, send)


# PostgreSQL or Redis away during a handshake (the session lookup, the channel layer): 503.
_websockets = DependencyDownAsgi(_route_websockets)


_http = AdmissionLimit(
    WsgiOnThreads(django_wsgi_app, threads=settings.WEB_THREADS),
    limit=settings.WEB_MAX_INFLIGHT,
    retry_after_s=settings.WEB_RETRY_AFTER_S,
)
_sessions = DependencyDownAsgi(AuthMiddlewareStack(session_http_app))


async def _http_or_sessions(scope, receive, send):
    # Interactive sessions are proxied asynchronously (long polls, streams), not on a thread.
    app = _sessions if scope["path"].startswith(SESSION_HTTP_PREFIX) else _http
    return await app(scope, receive, send)


application = ProtocolTypeRouter({"http": _http_or_sessions, "websocket": _websockets})
