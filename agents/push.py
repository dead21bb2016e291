"""The websocket on which the portal pushes "desired state changed"; the agent then pulls.

A lost push loses nothing: the agent also pulls every sync interval, and every
(re)connection asks the agent to re-sync, since pushes sent while disconnected are gone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from agents.backoff import Backoff
from agents.protocol import ProtocolError, PushMessage, from_json

log = logging.getLogger(__name__)


class PushListener:
    """A daemon thread holding the websocket open, reconnecting with backoff."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        on_push: Callable[[int], None],
        on_connect: Callable[[], None],
        backoff: Backoff | None = None,
    ) -> None:
        self._url = url
        self._headers = headers
        self._on_push = on_push
        self._on_connect = on_connect
        self._backoff = backoff or Backoff()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="push-listener", daemon=True)
        self._ws = None

    def start(self) -> None:
        """Connect in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Close the connection and end the thread."""
        self._stopping.set()
        if self._ws is not None:
            self._ws.close()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except InvalidStatus as exc:
                log.warning("push websocket refused: HTTP %s", exc.response.status_code)
            except Exception as exc:  # any network trouble: back off and reconnect
                log.info("push websocket lost: %s", exc)
            self._stopping.wait(self._backoff.next_delay())

    def _listen(self) -> None:
        with connect(self._url, additional_headers=self._headers, open_timeout=10) as ws:
            self._ws = ws
            self._backoff.reset()
            self._on_connect()
            for raw in ws:
                self._handle(raw)

    def _handle(self, raw: str | bytes) -> None:
        try:
            message = from_json(PushMessage, raw)
        except ProtocolError as exc:
            log.warning("ignoring a push the agent does not understand: %s", exc)
            return
        self._on_push(message.generation)
