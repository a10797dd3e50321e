"""The agent's own API: `POST /v1/agent/chat` (one turn of a thread, or its events as a stream) and
`GET /v1/agent/threads/{id}` (a thread's turns)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import asdict

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from gatehead.server.deps import ServicesDep, Tenant, TenantDep
from gatehead.server.errors import ApiError, error_response, request_id
from gatehead.server.middleware import bounded, timed
from gatehead.server.schemas import THREAD_ID, ChatRequest
from gatehead.server.services import Services
from gatehead.server.sse import agent_error, event, with_errors

router = APIRouter()


@router.post("/v1/agent/chat")
async def chat(body: ChatRequest, request: Request, services: ServicesDep, tenant: TenantDep):
    public, key = tenant.thread(body.thread_id)
    if not body.message.strip():
        raise ApiError(400, "the message is empty")
    if body.stream:
        events = with_errors(_events(services, tenant, body.message, key, public), agent_error, request_id(request),
                             services.trouble)
        return StreamingResponse(timed(request, services, events, lambda m: agent_error(504, "timeout", m, {})),
                                 media_type="text/event-stream")
    with services.claimed(key):
        result = await bounded(request, services, services.agent.ask(body.message, key, cache_salt=tenant.cache_salt))
    services.record_turn(result)
    if result.error:
        return error_response(502, result.error, "retrieval_error")
    return _payload(result, public)


@router.get("/v1/agent/threads/{thread_id}")
async def thread(thread_id: str, services: ServicesDep, tenant: TenantDep) -> dict:
    if not services.serving:  # admission checks POSTs only
        raise ApiError(503, "gatehead is not ready", "unavailable", {"Retry-After": "5"})
    if not THREAD_ID.fullmatch(thread_id):
        raise ApiError(400, "a thread id is 1-128 characters of letters, digits and . _ : -")
    public, key = tenant.thread(thread_id)
    turns = await services.agent.history(key)
    if not turns:
        raise ApiError(404, f"no thread {public!r} for this key", "not_found_error")
    return {"thread_id": public, "turns": [{"role": t.role, "text": t.text} for t in turns]}


async def _events(services: Services, tenant: Tenant, message: str, key: str, public: str) -> AsyncIterator[str]:
    with services.claimed(key):
        async for item in services.agent.stream(message, key, cache_salt=tenant.cache_salt):
            if item.kind == "token":
                yield event("token", {"text": item.text})
            elif item.kind == "node":
                keep = ("gates", "ask", "error")
                yield event("node", {"node": item.node, **{k: v for k, v in item.data.items() if k in keep}})
            else:
                services.record_turn(item.result)
                yield event("final", _payload(item.result, public))


def _payload(result, public_thread: str) -> dict:
    """The turn as the API reports it: `decision` is what the user got (a refusal the model wrote is "refuse",
    `refusal_reason` "generated"); `grounded` is null for any decision but "answer"."""
    return {"thread_id": public_thread, "answer": result.answer, "decision": result.decision,
            "refusal_reason": result.refusal_reason or None, "grounded": result.grounded,
            "probabilities": result.probs, "gates": result.gates, "queries": result.queries,
            "sources": result.sources, "passages": [asdict(p) for p in result.passages],
            "dropped": result.dropped, "rewrite_fallbacks": result.rewrite_fallbacks, "error": result.error or None}
