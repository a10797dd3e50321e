"""`POST /v1/gate`: one gate decision, or a batch of them, over documents the client sends."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from gatehead.agent import gate_decision
from gatehead.gate.policy import Thresholds
from gatehead.gate.prompt import Passage, Turn
from gatehead.server.deps import ServicesDep, TenantDep
from gatehead.server.middleware import bounded
from gatehead.server.schemas import GateBatch, GateItem
from gatehead.server.services import Services

router = APIRouter()


@router.post("/v1/gate")
async def gate(body: GateItem | GateBatch, request: Request, services: ServicesDep, tenant: TenantDep) -> dict:
    if isinstance(body, GateBatch):
        for item in body.items:  # every item's thresholds checked before any work starts
            if item.thresholds is not None:
                Thresholds.from_dict(item.thresholds)
        work = _all_or_none([_gate_one(services, item, tenant.cache_salt) for item in body.items])
        return {"results": await bounded(request, services, work)}
    return await bounded(request, services, _gate_one(services, body, tenant.cache_salt))


async def _gate_one(services: Services, item: GateItem, salt: str | None) -> dict:
    thresholds = Thresholds.from_dict(item.thresholds) if item.thresholds is not None else None
    passages = [Passage(text=d) if isinstance(d, str) else Passage(**d.model_dump()) for d in item.documents]
    turns = [Turn(m.role, m.content) for m in item.conversation]
    result = await gate_decision(services.engine, item.question, passages, turns, thresholds, salt)
    services.metrics.gate(result["decision"], result["probs"])
    dropped = result.pop("prompt").dropped
    return {**result, "dropped": {"turns": list(dropped.turns), "documents": list(dropped.passages)}}


async def _all_or_none(coroutines: list) -> list:
    """Results of all, in order; if one fails, the others are cancelled (no orphaned engine work)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
