"""The OpenAI-compatible API: `GET /v1/models` and `POST /v1/chat/completions`.

Two models: `gatehead-agent` runs an agent turn on the conversation the request carries (its
thread is deleted after), and the base model's name generates plainly. Fields gatehead does not
implement are refused (400) rather than silently ignored. `usage` counts the engine's tokens: a
plain completion's prompt and text, an agent turn's every request (gates, rewrites, the answer:
`TurnResult.usage`); `stream_options.include_usage` adds OpenAI's last chunk with it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from gatehead.gate.prompt import Turn
from gatehead.server.deps import ServicesDep, TenantDep
from gatehead.server.errors import ApiError, error_response, request_id
from gatehead.server.middleware import bounded, timed
from gatehead.server.schemas import AGENT_MODEL, CompletionRequest
from gatehead.server.services import Services
from gatehead.server.sse import DONE, chunk, openai_error, with_errors

router = APIRouter()

# OpenAI request fields gatehead does not implement, with the values that mean "not used": any other
# value is refused (400) rather than silently ignored.
UNSUPPORTED = {"tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
               "function_call": (None, "none"), "response_format": (None, {"type": "text"}),
               "logprobs": (None, False), "top_logprobs": (None, 0), "logit_bias": (None, {}),
               "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "audio": (None,),
               "modalities": (None, ["text"]), "prediction": (None,),
               # vLLM's own sampling extras
               "top_k": (None, -1, 0), "min_p": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
               "min_tokens": (None, 0), "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,),
               "structured_outputs": (None,), "logits_processors": (None,)}


@router.get("/v1/models")
async def models(services: ServicesDep) -> dict:
    created = int(time.time())
    return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "gatehead"}
                                       for name in (AGENT_MODEL, services.config.base_name)]}


@router.post("/v1/chat/completions")
async def chat_completions(body: CompletionRequest, request: Request, services: ServicesDep, tenant: TenantDep):
    base = services.config.base_name
    if body.model not in (AGENT_MODEL, base):
        raise ApiError(404, f"model {body.model!r} does not exist; this server has {AGENT_MODEL!r} and {base!r}",
                       "not_found_error")
    stop = _refuse_unsupported(body, agent=body.model == AGENT_MODEL)
    messages = [(m.role if m.role != "developer" else "system", _text(m.content)) for m in body.messages]
    max_tokens = body.max_completion_tokens or body.max_tokens
    completion = Completion(f"chatcmpl-{uuid.uuid4().hex}", body.model,
                            body.stream_options is not None and body.stream_options.include_usage)
    if body.model == AGENT_MODEL:
        return await _agent_turn(request, services, tenant.cache_salt, completion, messages, max_tokens, body.stream)
    engine = services.engine
    prompt = engine.prompts.chat(messages)
    limit = max_tokens or max(1, min(512, engine.max_model_len - len(prompt)))
    engine.check_length(prompt, limit)  # before a stream starts
    sampling = {"max_tokens": limit, "temperature": body.temperature or 0.0, "top_p": body.top_p or 1.0,
                "stop": stop, "seed": body.seed, "ignore_eos": body.ignore_eos, "cache_salt": tenant.cache_salt}
    if body.stream:
        return _streaming(request, services, _plain_chunks(services, completion, prompt, sampling))
    out = await bounded(request, services, services.generator.generate(prompt, **sampling))
    usage = _usage(len(prompt), len(out.token_ids), out.num_cached_tokens)
    return completion.whole(out.text, _finish(out.finish_reason), usage, None)


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    """OpenAI's usage object."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def _turn_usage(result) -> dict:
    """An agent turn's usage: every engine request it made (gates, rewrites, the answer; `TurnResult.usage`)."""
    spent = result.usage
    return _usage(spent["prompt_tokens"], spent["completion_tokens"], spent["cached_tokens"])


class Completion:
    """One completion's id and model, which every chunk and the whole response carry; `include_usage`: the
    stream ends with a usage chunk (`stream_options`)."""

    def __init__(self, completion_id: str, model: str, include_usage: bool = False) -> None:
        self.id, self.model, self.include_usage = completion_id, model, include_usage

    def chunk(self, delta: dict, finish: str | None = None, extra: dict | None = None) -> str:
        return chunk(self.id, self.model, delta, finish, extra, None if self.include_usage else False)

    def usage_chunk(self, usage: dict) -> str:
        """The stream's last chunk where usage was asked for: no choices, the usage."""
        return chunk(self.id, self.model, None, None, None, usage)

    def whole(self, text: str, finish: str, usage: dict, gatehead: dict | None) -> dict:
        out = {"id": self.id, "object": "chat.completion", "created": int(time.time()), "model": self.model,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
               "usage": usage}
        if gatehead is not None:
            out["gatehead"] = gatehead
        return out


async def _agent_turn(request: Request, services: Services, salt: str | None, completion: Completion,
                      messages: list[tuple[str, str]], max_tokens: int | None, stream: bool):
    budget = services.engine.prompts.answer_tokens
    if max_tokens is not None and max_tokens > budget:
        raise ApiError(400, f"max_tokens for {AGENT_MODEL} is at most {budget} (the answer's budget in the "
                            f"prompt window)")
    if messages[-1][0] != "user":
        raise ApiError(400, "the last message must be the user's question")
    history = [Turn(role, text) for role, text in messages[:-1] if role in ("user", "assistant")]
    question = messages[-1][1]
    if not question.strip():
        raise ApiError(400, "the last user message is empty")
    if stream:
        return _streaming(request, services, _agent_chunks(services, completion, question, history, salt, max_tokens))
    result = await bounded(request, services, _one_off_turn(services, question, history, salt, max_tokens))
    services.record_turn(result)
    if result.error:
        return error_response(502, result.error, "retrieval_error")
    return completion.whole(result.answer, _finish(result.finish_reason), _turn_usage(result), _gatehead(result))


def _streaming(request: Request, services: Services, chunks: AsyncIterator[str]) -> StreamingResponse:
    events = with_errors(chunks, openai_error, request_id(request), services.trouble)
    return StreamingResponse(timed(request, services, events, lambda m: openai_error(504, "timeout", m, {})),
                             media_type="text/event-stream")


async def _one_off_turn(services: Services, question: str, history: list[Turn], salt: str | None,
                        max_tokens: int | None):
    """An agent turn on a conversation the request carries: its thread is deleted after."""
    thread = uuid.uuid4().hex
    try:
        return await services.agent.ask(question, thread, history=history, cache_salt=salt,
                                        max_answer_tokens=max_tokens)
    finally:
        with anyio.CancelScope(shield=True):  # a gone client's stream is cancelled: the delete must still run
            await services.saver.adelete_thread(thread)


async def _agent_chunks(services: Services, completion: Completion, question: str, history: list[Turn],
                        salt: str | None, max_tokens: int | None) -> AsyncIterator[str]:
    thread = uuid.uuid4().hex
    yield completion.chunk({"role": "assistant", "content": ""})
    try:
        async for item in services.agent.stream(question, thread, history=history, cache_salt=salt,
                                                max_answer_tokens=max_tokens):
            if item.kind == "token":
                yield completion.chunk({"content": item.text})
            elif item.kind == "final":
                result = item.result
                services.record_turn(result)
                if result.error:  # no answer: an error event, as OpenAI streams report errors
                    yield openai_error(502, "retrieval_error", result.error, {})
                    return
                if not result.generated and result.answer:  # a refusal or a question back is said, not streamed
                    yield completion.chunk({"content": result.answer})
                yield completion.chunk({}, _finish(result.finish_reason), _gatehead(result))
                if completion.include_usage:
                    yield completion.usage_chunk(_turn_usage(result))
        yield DONE
    finally:
        with anyio.CancelScope(shield=True):  # a gone client's stream is cancelled: the delete must still run
            await services.saver.adelete_thread(thread)


async def _plain_chunks(services: Services, completion: Completion, prompt: list[int],
                        sampling: dict) -> AsyncIterator[str]:
    started, text, first, finish, last = time.perf_counter(), "", True, None, None
    yield completion.chunk({"role": "assistant", "content": ""})
    async for out in services.generator.stream(prompt, **sampling):
        if out.text != text:
            if first:
                services.metrics.ttft.observe(time.perf_counter() - started)
                first = False
            yield completion.chunk({"content": out.text[len(text):]})
            text = out.text
        finish, last = out.finish_reason, out
    yield completion.chunk({}, _finish(finish))
    if completion.include_usage:
        yield completion.usage_chunk(_usage(len(prompt), len(last.token_ids) if last else 0,
                                            last.num_cached_tokens if last else 0))
    yield DONE


def _refuse_unsupported(body: CompletionRequest, agent: bool) -> list[str]:
    """The stop strings to use; 400 for any field gatehead would otherwise ignore."""
    extra = body.model_extra or {}
    used = sorted(name for name, idle in UNSUPPORTED.items() if name in extra and extra[name] not in idle)
    if used:
        raise ApiError(400, f"gatehead does not support {', '.join(used)}; leave them out", param=used[0])
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > 4 or any(not s for s in stop):
        raise ApiError(400, "stop takes at most 4 non-empty strings")
    if agent:
        tuned = [name for name, value, idle in (("temperature", body.temperature, 0), ("top_p", body.top_p, 1),
                                                ("stop", stop, []), ("ignore_eos", body.ignore_eos, False))
                 if value is not None and value != idle]
        if tuned:
            raise ApiError(400, f"the {AGENT_MODEL} model answers greedily from the documents; it does not take "
                                f"{', '.join(tuned)}")
    return stop


def _text(content: str | list[dict[str, Any]] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, "only text content parts are supported")
        parts.append(part["text"])
    return "".join(parts)


def _gatehead(result) -> dict:
    """The turn's own fields beside the OpenAI ones: the decision the user got, and how it came about."""
    return {"decision": result.decision, "refusal_reason": result.refusal_reason or None, "grounded": result.grounded,
            "gates": result.gates, "sources": result.sources, "rewrite_fallbacks": result.rewrite_fallbacks,
            "usage": result.usage["nodes"]}


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"
