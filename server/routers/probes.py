"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse

from gatehead.server.deps import ServicesDep

log = logging.getLogger("gatehead.server")
router = APIRouter()


@router.get("/livez")
async def livez(services: ServicesDep) -> JSONResponse:
    if services.failed:  # the reason is in the log, not on an unauthenticated route
        return JSONResponse({"status": "failed"}, 503)
    if services.engine is not None and not services.engine.alive:
        return JSONResponse({"status": "engine dead"}, 503)
    return JSONResponse({"status": "alive"})


@router.get("/readyz")
async def readyz(services: ServicesDep) -> JSONResponse:
    if not services.serving:
        why = "draining" if services.draining else "failed" if services.failed else "starting"
        return JSONResponse({"status": why}, 503)
    part = "engine"
    try:
        if not services.engine.alive:
            raise RuntimeError("the engine core is dead")
        health = getattr(services.engine, "health", None)  # a remote engine: every vLLM server must be healthy
        down = [url for url, healthy in (await health()).items() if not healthy] if health else []
        if down:
            return JSONResponse({"status": "unready", "unreachable": "engine", "servers": down}, 503)
        part = "store"
        await asyncio.to_thread(services.store.ping)
        part = "threads"
        await services.saver.aget_tuple({"configurable": {"thread_id": "readyz", "checkpoint_ns": ""}})
    except Exception:  # noqa: BLE001 - any dependency failing makes the service unready
        log.exception("readiness check failed: %s", part)
        return JSONResponse({"status": "unready", "unreachable": part}, 503)
    if services.canaries is not None and not services.canaries.healthy:  # the diffs are in the log
        failing = sorted(m.canary for m in services.canaries.state.last)
        return JSONResponse({"status": "unready", "canaries": failing}, 503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(services: ServicesDep) -> PlainTextResponse:
    if services.ready and services.engine is not None and services.engine.alive:
        services.metrics.engine(await services.engine.stats())
        if hasattr(services.engine, "server_stats"):
            services.metrics.servers(services.engine.server_stats())
    services.metrics.guard(services.guard)
    if services.canaries is not None:
        services.metrics.canaries(services.canaries.state)
    return PlainTextResponse(services.metrics.render(), media_type="text/plain; version=0.0.4")
