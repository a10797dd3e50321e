"""Running the service: uvicorn, with a SIGTERM that drains before it exits.

On the first SIGTERM or SIGINT the service stops being ready (`/readyz` and new API requests get
503), waits for the requests in flight (at most `drain_seconds`), then lets uvicorn close its
listeners and finish open streams within the same budget. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import uvicorn

from gatehead.server.app import create_app
from gatehead.server.config import ServerConfig

log = logging.getLogger("gatehead.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, services, drain_seconds: float) -> None:
        super().__init__(config)
        self.services, self.drain_seconds, self.draining = services, drain_seconds, False
        self.loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig, frame) -> None:
        if self.draining or self.loop is None:
            return super().handle_exit(sig, frame)
        self.draining = self.services.draining = True
        log.info("draining: not ready; waiting up to %.0f s for %d request(s) in flight", self.drain_seconds,
                 self.services.inflight)
        self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        ends = time.monotonic() + self.drain_seconds
        while self.services.inflight and time.monotonic() < ends:
            await asyncio.sleep(0.1)
        self.should_exit = True


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000) -> None:
    app = create_app(config)
    uv = uvicorn.Config(app, host=host, port=port, log_level="info",
                        timeout_graceful_shutdown=max(1, int(config.drain_seconds)))
    DrainingServer(uv, app.state.services, config.drain_seconds).run()
