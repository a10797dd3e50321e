"""gatehead's HTTP service: the agent's chat endpoint, the gate endpoint and an OpenAI-compatible API.

`create_app(config)` builds the FastAPI app: the services (`services.py`, built once by a
background task the lifespan starts; until they are ready `/readyz` and the API answer 503), the
admission middleware (`middleware.py`: request ids, API keys, body limit, shedding), the exception
handlers (`errors.py`) and the routers (`routers/`). A tenant is its API key: threads and
prefix-cache blocks are keyed by a hash of it, never by client-supplied ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from fastapi import FastAPI

import gatehead
from gatehead.server.config import ServerConfig
from gatehead.server.errors import install_handlers
from gatehead.server.middleware import Admission
from gatehead.server.routers import agent, gate, openai, page, probes
from gatehead.server.services import Opener, Services, open_backends

log = logging.getLogger("gatehead.server")


def create_app(config: ServerConfig, opener: Opener = open_backends) -> FastAPI:
    """The app for `config`; `opener` opens the engine, store and checkpointer (a test may script them)."""
    services = Services(config, opener)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not config.api_keys:
            log.warning("no API keys configured: gatehead serves every client without authentication")
        starting = asyncio.create_task(services.start())
        yield
        services.draining = True
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await services.stop()

    app = FastAPI(title="gatehead", version=gatehead.__version__, lifespan=lifespan)
    app.state.services = services
    app.add_middleware(Admission, services=services)
    if config.cors_origins:  # added last: outermost, so preflights and admission's own replies carry CORS headers
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=["X-Request-Id"])
    install_handlers(app)
    for module in (probes, gate, agent, openai, page):
        app.include_router(module.router)
    return app
