"""Admission: what happens to a request before and around its route.

`Admission` (plain ASGI, so that routes see the client's disconnect) gives every request an id
(`X-Request-Id`), checks its API key (constant-time; the tenant is a hash of the key), its declared
and actual body size (413), and, for API POSTs, readiness (503) and the in-flight bound beyond which
requests are shed with 503 + Retry-After before any work; it counts every request in the metrics.
`bounded` and `timed` put a route's engine work under the request's deadline (504) and cancel it
when the client goes away.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from fastapi import Request

from gatehead.server.errors import ApiError, error_response
from gatehead.server.routers.page import PAGE_PATHS
from gatehead.server.services import Services

log = logging.getLogger("gatehead.server")
PROBES = ("/livez", "/readyz")
PUBLIC = (*PROBES, *PAGE_PATHS)  # no key asked
ROUTES = {"/livez", "/readyz", "/metrics", "/v1/gate", "/v1/agent/chat", "/v1/models", "/v1/chat/completions",
          *PUBLIC}  # metric labels; any other path counts as "other"


def tenant_of_key(token: bytes) -> str:
    return hashlib.sha256(b"gatehead-tenant:" + token).hexdigest()[:24]


class Admission:
    def __init__(self, app, services: Services) -> None:
        self.app, self.services = app, services
        self.keys = [k.encode() for k in services.config.api_keys]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status, rid = time.perf_counter(), [500], uuid.uuid4().hex[:16]
        scope.setdefault("state", {}).update(tenant="open", request_id=rid)

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self._admit(scope, receive, sending)
        finally:
            path = scope["path"]
            route = path if path in ROUTES else "/v1/agent/threads" if path.startswith("/v1/agent/threads/") \
                else "other"
            self.services.metrics.request(route, status[0], time.perf_counter() - started)
            if status[0] == 500:  # an unexpected failure: a sick engine is one cause the canaries can rule out
                self.services.trouble()

    async def _admit(self, scope, receive, send) -> None:
        path, services, config = scope["path"], self.services, self.services.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}

        async def reply(response) -> None:
            await response(scope, receive, send)

        if path not in PUBLIC and self.keys:
            given = headers.get("authorization", "")
            token = given[7:].encode() if given.lower().startswith("bearer ") else b""
            matched = [hmac.compare_digest(token, k) for k in self.keys]  # every key compared: constant time
            if not any(matched):
                return await reply(error_response(401, "a valid API key is required (Authorization: Bearer <key>)",
                                                  "authentication_error", {"WWW-Authenticate": "Bearer"}))
            scope["state"]["tenant"] = tenant_of_key(token)
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
            return await reply(error_response(413, f"the request body is over the {config.max_body_bytes}-byte "
                                                   f"limit", "invalid_request_error"))
        if not path.startswith("/v1/") or scope["method"] != "POST":
            return await self._limited(scope, receive, send)
        if not services.serving:
            return await reply(error_response(503, f"gatehead is {services.unavailable()}", "unavailable",
                                              {"Retry-After": "5"}))
        if services.inflight >= config.max_inflight:
            services.metrics.shed.inc()
            return await reply(error_response(503, f"gatehead is at its limit of {config.max_inflight} requests in "
                                                   f"flight; retry shortly", "overloaded", {"Retry-After": "1"}))
        services.inflight += 1
        services.metrics.inflight.set(services.inflight)
        try:
            await self._limited(scope, receive, send)
        finally:
            services.inflight -= 1
            services.metrics.inflight.set(services.inflight)

    async def _limited(self, scope, receive, send) -> None:
        """The app, with the body counted as it arrives: past the limit, 413 and the app sees a disconnect."""
        replied, seen, limit = [False], [0], self.services.config.max_body_bytes

        async def receiving():
            message = await receive()
            if message["type"] == "http.request" and not replied[0]:
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:
                    replied[0] = True
                    await error_response(413, f"the request body is over the {limit}-byte limit",
                                         "invalid_request_error")(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def sending(message) -> None:
            if not replied[0]:
                await send(message)

        try:
            await self.app(scope, receiving, sending)
        except Exception:
            if not replied[0]:
                raise


# ----- deadlines and disconnects --------------------------------------------------------------

EXPIRED = "the request ran past its deadline; its work was cancelled"


def deadline(request: Request, services: Services) -> float | None:
    """The request's deadline in seconds: the server's, or less if the client asks (X-Gatehead-Timeout)."""
    asked = request.headers.get("x-gatehead-timeout")
    limit = services.config.request_timeout
    if asked is not None:
        try:
            seconds = float(asked)
        except ValueError:
            raise ApiError(400, "X-Gatehead-Timeout must be a number of seconds") from None
        if not seconds > 0:
            raise ApiError(400, "X-Gatehead-Timeout must be > 0 seconds")
        limit = seconds if limit is None else min(limit, seconds)
    return limit


async def bounded(request: Request, services: Services, work: Awaitable[Any]) -> Any:
    """`work` under the request's deadline (504), cancelled if the client goes away."""
    try:
        limit = deadline(request, services)
    except ApiError:
        if asyncio.iscoroutine(work):
            work.close()
        raise
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while not task.done():
            if await request.is_disconnected():
                services.metrics.disconnects.inc()
                task.cancel()
                return
            await asyncio.sleep(0.25)

    watcher = asyncio.create_task(watch())
    try:
        return await asyncio.wait_for(task, limit)
    except asyncio.TimeoutError:
        services.metrics.timeouts.inc()
        raise ApiError(504, EXPIRED, "timeout") from None
    except asyncio.CancelledError:
        raise ApiError(499, "the client closed the request", "cancelled") from None
    finally:
        watcher.cancel()


def timed(request: Request, services: Services, events: AsyncIterator[str],
          expired: Callable[[str], str]) -> AsyncIterator[str]:
    """A response stream under the request's deadline; cancelled with its engine work on a disconnect.

    Past the deadline the stream ends with `expired(message)` (an error event: the status line has
    long gone); a client that goes away cancels the stream (Starlette) and so the engine request.
    """
    limit = deadline(request, services)  # before the response starts: a bad header is still a 400
    end = None if limit is None else time.monotonic() + limit
    metrics = services.metrics

    async def stream() -> AsyncIterator[str]:
        finished = False
        try:
            while True:
                try:
                    if end is None:
                        event = await anext(events)
                    else:
                        event = await asyncio.wait_for(anext(events), max(0.0, end - time.monotonic()))
                except StopAsyncIteration:
                    finished = True
                    return
                except asyncio.TimeoutError:
                    finished = True
                    metrics.timeouts.inc()
                    yield expired(EXPIRED)
                    return
                yield event
        finally:
            if not finished:  # cancelled or closed mid-stream: the client went away
                metrics.disconnects.inc()
            with anyio.CancelScope(shield=True):  # Starlette keeps cancelling a gone client's stream
                try:
                    await events.aclose()
                except RuntimeError:  # still inside its cancelled step: it cleans up there
                    log.warning("a cancelled stream was still running its last step at close")

    return stream()
