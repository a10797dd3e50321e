"""gatehead's HTTP service: the agent's chat endpoint, the gate endpoint and an OpenAI-compatible API.

`create_app(config)` builds the FastAPI app. The engine, store, embedder, checkpointer and agent
are built once, in a background task started by the lifespan, and shared by every request; until
they are ready `/readyz` and the API answer 503. Around the routes: API keys (constant-time
comparison) on everything but the probes, a request-size limit (413), a bounded number of requests
in flight beyond which requests are shed with 503 + Retry-After before any work, an optional
deadline (504) that cancels the engine's work, and client disconnects that abort it. A tenant is
its API key: threads and prefix-cache blocks are keyed by a hash of it, never by client-supplied ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from gatehead.agent import AgentConfig, gate_decision
from gatehead.gate.policy import Thresholds
from gatehead.gate.prompt import Passage, Turn
from gatehead.retrieval.config import StoreConfig
from gatehead.runtime.canary import Canaries, CanaryConfig
from gatehead.runtime.engine import GateError
from gatehead.runtime.guard import DegenerateOutput, GuardConfig, GuardCounters, GuardedEngine
from gatehead.server.metrics import Metrics

log = logging.getLogger("gatehead.server")
AGENT_MODEL = "gatehead-agent"
WARM_UP = "The engine runs this prompt once before it serves, so that its first forward is not a request's."
PROBES = ("/livez", "/readyz")
STATIC = Path(__file__).parent / "static"
PAGE_FILES = {"chat.js": "text/javascript", "chat.css": "text/css"}
# The chat page and its two files hold no data: they load without a key (the page asks for one).
PUBLIC = (*PROBES, "/", *(f"/static/{name}" for name in PAGE_FILES))
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


@dataclass(frozen=True)
class ServerConfig:
    """How the service runs; `gatehead serve` fills it from flags and the environment."""

    model: str | Path
    adapter: str | Path
    store: StoreConfig = field(default_factory=StoreConfig)
    corpus: tuple[str | Path, ...] = ()  # ingested into the store at start (`gatehead serve`'s default: the demo's)
    threads: str | None = None  # SQLite path or postgres:// URL; default: threads.sqlite next to the store
    api_keys: tuple[str, ...] = ()  # none: the server runs open (and says so at startup)
    cors_origins: tuple[str, ...] = ()  # none: no cross-origin requests
    max_body_bytes: int = 1 << 20
    max_inflight: int = 32  # requests in flight beyond which new ones are shed (503)
    request_timeout: float | None = None  # seconds; a client may ask for less with X-Gatehead-Timeout
    drain_seconds: float = 30.0  # on SIGTERM: how long in-flight requests may take to finish
    kv_cache_bytes: int = 256 << 20
    enforce_eager: bool = True
    max_model_len: int | None = None
    block_size: int | None = None  # tokens per KV-cache block; default: the platform's (CPU: 128, multiples of 32 only)
    max_num_batched_tokens: int | None = None  # tokens per engine step; longer prompts are prefilled in chunks
    engine_args: dict[str, Any] = field(default_factory=dict)  # more vLLM engine arguments (tensor_parallel_size...)
    base_model_name: str | None = None  # the plain-generation model's id; default: the model directory's name
    agent: AgentConfig = field(default_factory=AgentConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)  # the degenerate-output guard on every generation
    canary: CanaryConfig = field(default_factory=CanaryConfig)  # known-answer requests that watch the engine

    def __post_init__(self) -> None:
        if any(not k or k != k.strip() for k in self.api_keys):
            raise ValueError("API keys must be non-empty and have no surrounding spaces")
        for name in ("max_body_bytes", "max_inflight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")

    @property
    def base_name(self) -> str:
        return self.base_model_name or Path(self.model).resolve().name


class Runtime:
    """What the lifespan builds once: engine, store, checkpointer, agent; and the service's state."""

    def __init__(self) -> None:
        self.engine = self.store = self.saver = self.agent = None
        self.generator = None  # the engine as generations see it: behind the guard, unless it is off
        self.guard = GuardCounters()
        self.canaries: Canaries | None = None
        self.ready = False
        self.draining = False
        self.failed: str | None = None
        self.inflight = 0
        self._stack = contextlib.AsyncExitStack()

    @property
    def serving(self) -> bool:
        """Started, not failed, not draining: requests may be taken."""
        return self.ready and not self.failed and not self.draining

    async def start(self, config: ServerConfig) -> None:
        from gatehead.agent import Agent
        from gatehead.agent.checkpoint import default_checkpoint_path, open_checkpointer
        from gatehead.retrieval.store import open_store
        from gatehead.runtime.engine import EngineConfig, SharedEngine

        try:
            self.store = await asyncio.to_thread(open_store, config.store, config.corpus, None, log.info)
            default_threads = str(default_checkpoint_path(config.store))
            self.engine = await asyncio.to_thread(SharedEngine, EngineConfig(
                model=config.model, adapter=config.adapter, enforce_eager=config.enforce_eager,
                kv_cache_memory_bytes=config.kv_cache_bytes, max_model_len=config.max_model_len,
                block_size=config.block_size, max_num_batched_tokens=config.max_num_batched_tokens,
                extra=dict(config.engine_args)))
            self.saver = await self._stack.enter_async_context(open_checkpointer(config.threads or default_threads))
            self.generator = GuardedEngine(self.engine, config.guard, self.guard)
            self.agent = Agent(self.generator, self.store, config.agent, self.saver)
            # Warm-up. Not a one-token prompt: on an AMX CPU in bf16, vLLM's CPU worker dies of SIGILL when
            # the first forward it runs is one or two tokens long (seen with the 12-layer demo model).
            await self.engine.generate(self.engine.tokenizer.encode(WARM_UP, add_special_tokens=False), max_tokens=1)
            if config.canary.enabled:
                self.canaries = Canaries(self.engine, config.canary)
                await self.canaries.record()
                self.guard.on_trip = self.canaries.poke
                watcher = asyncio.create_task(self.canaries.watch())
                self._stack.push_async_callback(_cancelled, watcher)
            self.ready = True
            log.info("gatehead is ready")
        except Exception as exc:  # noqa: BLE001 - reported by /readyz and /livez; the process stays inspectable
            self.failed = f"{type(exc).__name__}: {exc}"
            log.exception("gatehead failed to start")

    def trouble(self) -> None:
        """An error a request met that a sick engine could cause: check the canaries now."""
        if self.canaries is not None:
            self.canaries.poke()

    async def stop(self) -> None:
        self.ready = False
        await self._stack.aclose()
        if self.engine is not None:
            await asyncio.to_thread(self.engine.shutdown)
        if self.store is not None:
            self.store.close()


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# ----- request bodies ---------------------------------------------------------------------------


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Document(Strict):
    text: str = Field(min_length=1)
    title: str = ""
    source: str = ""
    score: float = 0.0


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str


class GateItem(Strict):
    question: str = Field(min_length=1)
    documents: list[str | Document] = Field(default_factory=list, max_length=64)
    conversation: list[Message] = Field(default_factory=list, max_length=256)
    thresholds: dict[str, float] | None = None


class GateBatch(Strict):
    items: list[GateItem] = Field(min_length=1, max_length=64)


THREAD_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ChatRequest(Strict):
    message: str = Field(min_length=1)
    thread_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=THREAD_ID.pattern)
    stream: bool = False


class OpenAIMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]] | None = None


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields gatehead ignores (user, metadata...)
    model: str = Field(examples=[AGENT_MODEL, "gatehead-demo"])
    messages: list[OpenAIMessage] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens whatever the model says


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


def _refuse_unsupported(body: CompletionRequest, agent: bool) -> list[str]:
    """The stop strings to use; 400 for any field gatehead would otherwise ignore."""
    extra = body.model_extra or {}
    used = sorted(name for name, idle in UNSUPPORTED.items() if name in extra and extra[name] not in idle)
    if used:
        raise ApiError(400, f"gatehead does not support {', '.join(used)}; leave them out")
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


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


# ----- the app ----------------------------------------------------------------------------------


def create_app(config: ServerConfig) -> FastAPI:
    runtime = Runtime()
    metrics = Metrics()
    keys = [k.encode() for k in config.api_keys]

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not keys:
            log.warning("no API keys configured: gatehead serves every client without authentication")
        starting = asyncio.create_task(runtime.start(config))
        yield
        runtime.draining = True
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await runtime.stop()

    app = FastAPI(title="gatehead", version=_version(), lifespan=lifespan)
    app.state.runtime, app.state.metrics, app.state.config = runtime, metrics, config
    def tenant_of(request: Request) -> str:
        return request.state.tenant

    app.add_middleware(Guard, runtime=runtime, metrics=metrics, config=config, keys=keys)
    if config.cors_origins:  # added last: outermost, so preflights and the guard's own replies carry CORS headers
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(GateError)
    async def gate_failed(request: Request, exc: GateError) -> JSONResponse:
        runtime.trouble()
        return error_response(500, f"the gate failed: {exc}", "gate_error")

    @app.exception_handler(DegenerateOutput)
    async def degenerate(request: Request, exc: DegenerateOutput) -> JSONResponse:
        return error_response(502, str(exc), "degenerate_output")

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error")

    def deadline(request: Request) -> float | None:
        asked = request.headers.get("x-gatehead-timeout")
        limit = config.request_timeout
        if asked is not None:
            try:
                seconds = float(asked)
            except ValueError:
                raise ApiError(400, "X-Gatehead-Timeout must be a number of seconds") from None
            if not seconds > 0:
                raise ApiError(400, "X-Gatehead-Timeout must be > 0 seconds")
            limit = seconds if limit is None else min(limit, seconds)
        return limit

    async def bounded(request: Request, work: Awaitable[Any]) -> Any:
        """`work` under the request's deadline (504), cancelled if the client goes away."""
        try:
            limit = deadline(request)
        except ApiError:
            if asyncio.iscoroutine(work):
                work.close()
            raise
        task = asyncio.ensure_future(work)

        async def watch() -> None:
            while not task.done():
                if await request.is_disconnected():
                    metrics.disconnects.inc()
                    task.cancel()
                    return
                await asyncio.sleep(0.25)

        watcher = asyncio.create_task(watch())
        try:
            return await asyncio.wait_for(task, limit)
        except asyncio.TimeoutError:
            metrics.timeouts.inc()
            raise ApiError(504, "the request ran past its deadline; its work was cancelled", "timeout") from None
        except asyncio.CancelledError:
            raise ApiError(499, "the client closed the request", "cancelled") from None
        finally:
            watcher.cancel()

    def timed(request: Request, events: AsyncIterator[str], expired: Callable[[str], str]) -> AsyncIterator[str]:
        """A response stream under the request's deadline; cancelled with its engine work on a disconnect.

        Past the deadline the stream ends with `expired(message)` (an error event: the status line has
        long gone); a client that goes away cancels the stream (Starlette) and so the engine request.
        """
        limit = deadline(request)  # before the response starts: a bad header is still a 400
        end = None if limit is None else time.monotonic() + limit

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
                        yield expired("the request ran past its deadline; its work was cancelled")
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

    # ----- probes and metrics ----------------------------------------------------------------

    @app.get("/livez")
    async def livez() -> JSONResponse:
        if runtime.failed:  # the reason is in the log, not on an unauthenticated route
            return JSONResponse({"status": "failed"}, 503)
        if runtime.engine is not None and not runtime.engine.alive:
            return JSONResponse({"status": "engine dead"}, 503)
        return JSONResponse({"status": "alive"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if not runtime.serving:
            why = "draining" if runtime.draining else "failed" if runtime.failed else "starting"
            return JSONResponse({"status": why}, 503)
        part = "engine"
        try:
            if not runtime.engine.alive:
                raise RuntimeError("the engine core is dead")
            part = "store"
            await asyncio.to_thread(runtime.store.ping)
            part = "threads"
            await runtime.saver.aget_tuple({"configurable": {"thread_id": "readyz", "checkpoint_ns": ""}})
        except Exception:  # noqa: BLE001 - any dependency failing makes the service unready
            log.exception("readiness check failed: %s", part)
            return JSONResponse({"status": "unready", "unreachable": part}, 503)
        if runtime.canaries is not None and not runtime.canaries.healthy:  # the diffs are in the log
            failing = sorted(m.canary for m in runtime.canaries.state.last)
            return JSONResponse({"status": "unready", "canaries": failing}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics_route() -> PlainTextResponse:
        if runtime.ready and runtime.engine is not None and runtime.engine.alive:
            metrics.engine(await runtime.engine.stats())
        metrics.guard(runtime.guard)
        if runtime.canaries is not None:
            metrics.canaries(runtime.canaries.state)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    # ----- gate ----------------------------------------------------------------------------------

    async def gate_one(item: GateItem, salt: str | None) -> dict:
        thresholds = Thresholds.from_dict(item.thresholds) if item.thresholds is not None else None
        passages = [Passage(text=d) if isinstance(d, str) else Passage(**d.model_dump()) for d in item.documents]
        turns = [Turn(m.role, m.content) for m in item.conversation]
        result = await gate_decision(runtime.engine, item.question, passages, turns, thresholds, salt)
        metrics.gate(result["decision"], result["probs"])
        dropped = result.pop("prompt").dropped
        return {**result, "dropped": {"turns": list(dropped.turns), "documents": list(dropped.passages)}}

    @app.post("/v1/gate")
    async def gate(body: GateItem | GateBatch, request: Request) -> dict:
        salt = _salt(tenant_of(request), keys)
        if isinstance(body, GateBatch):
            for item in body.items:  # every item's thresholds checked before any work starts
                if item.thresholds is not None:
                    Thresholds.from_dict(item.thresholds)
            return {"results": await bounded(request, _all_or_none([gate_one(i, salt) for i in body.items]))}
        return await bounded(request, gate_one(body, salt))

    # ----- the agent -----------------------------------------------------------------------------

    def thread_key(request: Request, thread_id: str | None) -> tuple[str, str]:
        """(the client's thread id, the internal key): threads are per tenant, whatever id a client sends."""
        public = thread_id or uuid.uuid4().hex
        return public, f"{tenant_of(request)}:{public}"

    busy: set[str] = set()  # threads with a turn running: one turn per thread at a time

    @contextlib.contextmanager
    def claimed(key: str):
        if key in busy:
            raise ApiError(409, "this thread already has a turn running; wait for it to finish", "conflict")
        busy.add(key)
        try:
            yield
        finally:
            busy.discard(key)

    def turn_payload(result, public_thread: str) -> dict:
        return {"thread_id": public_thread, "answer": result.answer, "decision": result.decision,
                "probabilities": result.probs, "gates": result.gates, "queries": result.queries,
                "sources": result.sources, "passages": [asdict(p) for p in result.passages],
                "dropped": result.dropped, "error": result.error or None}

    @app.post("/v1/agent/chat")
    async def agent_chat(body: ChatRequest, request: Request):
        public, key = thread_key(request, body.thread_id)
        salt = _salt(tenant_of(request), keys)
        if not body.message.strip():
            raise ApiError(400, "the message is empty")
        if body.stream:
            events = _agent_sse(runtime, metrics, body.message, key, public, salt, turn_payload, claimed)
            return StreamingResponse(timed(request, events, lambda m: _sse("error", {"message": m, "code": 504})),
                                     media_type="text/event-stream")
        started = time.perf_counter()
        with claimed(key):
            result = await bounded(request, runtime.agent.ask(body.message, key, cache_salt=salt))
        _record_turn(metrics, result, started)
        if result.error:
            return error_response(502, result.error, "retrieval_error")
        return turn_payload(result, public)

    @app.get("/v1/agent/threads/{thread_id}")
    async def agent_thread(thread_id: str, request: Request) -> dict:
        if not runtime.serving:  # the guard checks POSTs only
            raise ApiError(503, "gatehead is not ready", "unavailable", {"Retry-After": "5"})
        if not THREAD_ID.fullmatch(thread_id):
            raise ApiError(400, "a thread id is 1-128 characters of letters, digits and . _ : -")
        public, key = thread_key(request, thread_id)
        turns = await runtime.agent.history(key)
        if not turns:
            raise ApiError(404, f"no thread {public!r} for this key", "not_found_error")
        return {"thread_id": public, "turns": [{"role": t.role, "text": t.text} for t in turns]}

    # ----- the chat page -------------------------------------------------------------------------

    @app.get("/", include_in_schema=False)
    async def chat_page() -> FileResponse:
        return FileResponse(STATIC / "chat.html", media_type="text/html", headers=PAGE_HEADERS)

    @app.get("/static/{name}", include_in_schema=False)
    async def page_file(name: str) -> FileResponse:
        if name not in PAGE_FILES:
            raise ApiError(404, "no such file", "not_found_error")
        return FileResponse(STATIC / name, media_type=PAGE_FILES[name], headers=PAGE_HEADERS)

    # ----- OpenAI-compatible ---------------------------------------------------------------------

    @app.get("/v1/models")
    async def models() -> dict:
        created = int(time.time())
        return {"object": "list", "data": [{"id": name, "object": "model", "created": created, "owned_by": "gatehead"}
                                           for name in (AGENT_MODEL, config.base_name)]}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: CompletionRequest, request: Request):
        if body.model not in (AGENT_MODEL, config.base_name):
            raise ApiError(404, f"model {body.model!r} does not exist; this server has {AGENT_MODEL!r} and "
                                f"{config.base_name!r}", "not_found_error")
        stop = _refuse_unsupported(body, agent=body.model == AGENT_MODEL)
        messages = [(m.role if m.role != "developer" else "system", _text(m.content)) for m in body.messages]
        max_tokens = body.max_completion_tokens or body.max_tokens
        expired = lambda message: _error_chunk(message, "timeout", 504)  # noqa: E731
        salt = _salt(tenant_of(request), keys)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        if body.model == AGENT_MODEL:
            budget = runtime.engine.prompts.answer_tokens
            if max_tokens is not None and max_tokens > budget:
                raise ApiError(400, f"max_tokens for {AGENT_MODEL} is at most {budget} (the answer's budget in the "
                                    f"prompt window)")
            if messages[-1][0] != "user":
                raise ApiError(400, "the last message must be the user's question")
            history = [Turn(role, text) for role, text in messages[:-1] if role in ("user", "assistant")]
            question = messages[-1][1]
            if not question.strip():
                raise ApiError(400, "the last user message is empty")
            if body.stream:
                events = _openai_agent_sse(runtime, metrics, body.model, completion_id, question, history, salt,
                                           max_tokens)
                return StreamingResponse(timed(request, events, expired), media_type="text/event-stream")
            started = time.perf_counter()
            result = await bounded(request, _one_off_turn(runtime, question, history, salt, max_tokens))
            _record_turn(metrics, result, started)
            if result.error:
                return error_response(502, result.error, "retrieval_error")
            return _completion(completion_id, body.model, result.answer, _finish(result.finish_reason), None,
                               {"decision": result.decision, "gates": result.gates, "sources": result.sources})
        prompt = runtime.engine.prompts.chat(messages)
        limit = max_tokens or max(1, min(512, runtime.engine.max_model_len - len(prompt)))
        runtime.engine.check_length(prompt, limit)  # before a stream starts
        sampling = {"max_tokens": limit, "temperature": body.temperature or 0.0, "top_p": body.top_p or 1.0,
                    "stop": stop, "seed": body.seed, "ignore_eos": body.ignore_eos, "cache_salt": salt}
        if body.stream:
            events = _openai_plain_sse(runtime, metrics, body.model, completion_id, prompt, sampling)
            return StreamingResponse(timed(request, events, expired), media_type="text/event-stream")
        out = await bounded(request, runtime.generator.generate(prompt, **sampling))
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(out.token_ids),
                 "total_tokens": len(prompt) + len(out.token_ids)}
        return _completion(completion_id, body.model, out.text, _finish(out.finish_reason), usage, None)

    return app


class Guard:
    """ASGI middleware around every request: API key, body size, readiness, the in-flight bound, metrics.

    Plain ASGI rather than Starlette's BaseHTTPMiddleware, so that routes see the client's disconnect.
    """

    def __init__(self, app, runtime: Runtime, metrics: Metrics, config: ServerConfig, keys: list[bytes]) -> None:
        self.app, self.runtime, self.metrics, self.config, self.keys = app, runtime, metrics, config, keys

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), [500]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self._guarded(scope, receive, sending)
        finally:
            path = scope["path"]
            route = path if path in _ROUTES else "/v1/agent/threads" if path.startswith("/v1/agent/threads/") \
                else "other"
            self.metrics.request(route, status[0], time.perf_counter() - started)
            if status[0] == 500:  # an unexpected failure: a sick engine is one cause the canaries can rule out
                self.runtime.trouble()

    async def _guarded(self, scope, receive, send) -> None:
        path, runtime, config = scope["path"], self.runtime, self.config
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        scope.setdefault("state", {})["tenant"] = "open"

        async def reply(response) -> None:
            await response(scope, receive, send)

        if path not in PUBLIC and self.keys:
            given = headers.get("authorization", "")
            token = given[7:].encode() if given.lower().startswith("bearer ") else b""
            matched = [hmac.compare_digest(token, k) for k in self.keys]  # every key compared: constant time
            if not any(matched):
                return await reply(error_response(401, "a valid API key is required (Authorization: Bearer <key>)",
                                                  "authentication_error", {"WWW-Authenticate": "Bearer"}))
            scope["state"]["tenant"] = hashlib.sha256(b"gatehead-tenant:" + token).hexdigest()[:24]
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > config.max_body_bytes):
            return await reply(error_response(413, f"the request body is over the {config.max_body_bytes}-byte "
                                                   f"limit", "invalid_request_error"))
        if not path.startswith("/v1/") or scope["method"] != "POST":
            return await self._app(scope, receive, send)
        if not runtime.serving:
            why = "shutting down" if runtime.draining else "failed to start" if runtime.failed else "starting"
            return await reply(error_response(503, f"gatehead is {why}", "unavailable", {"Retry-After": "5"}))
        if runtime.inflight >= config.max_inflight:
            self.metrics.shed.inc()
            return await reply(error_response(503, f"gatehead is at its limit of {config.max_inflight} requests in "
                                                   f"flight; retry shortly", "overloaded", {"Retry-After": "1"}))
        runtime.inflight += 1
        self.metrics.inflight.set(runtime.inflight)
        try:
            await self._app(scope, receive, send)
        finally:
            runtime.inflight -= 1
            self.metrics.inflight.set(runtime.inflight)


    async def _app(self, scope, receive, send) -> None:
        """The app, with the body counted as it arrives: past the limit, 413 and the app sees a disconnect."""
        replied, seen, limit = [False], [0], self.config.max_body_bytes

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


_ROUTES = {"/livez", "/readyz", "/metrics", "/v1/gate", "/v1/agent/chat", "/v1/models", "/v1/chat/completions",
           *PUBLIC}


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


def _version() -> str:
    import gatehead

    return gatehead.__version__


def _salt(tenant: str, keys: list[bytes]) -> str | None:
    """The tenant's prefix-cache salt: one per API key; none on an open server (one tenant)."""
    return tenant if keys else None


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


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _completion(completion_id: str, model: str, text: str, finish: str, usage: dict | None,
                gatehead: dict | None) -> dict:
    out = {"id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
           "usage": usage or {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    if gatehead is not None:
        out["gatehead"] = gatehead
    return out


def _chunk(completion_id: str, model: str, delta: dict, finish: str | None, extra: dict | None = None) -> str:
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if extra is not None:
        body["gatehead"] = extra
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def _record_turn(metrics: Metrics, result, started: float) -> None:
    for gate in result.gates:
        metrics.gate(gate["decision"], gate["probs"])
    for timing in result.timings:
        if timing["node"] == "generate":
            metrics.ttft.observe(timing["ttft"])
    metrics.turns.labels(result.decision or "none").inc()


async def _one_off_turn(runtime: Runtime, question: str, history: list[Turn], salt: str | None,
                        max_tokens: int | None):
    """An OpenAI-API agent turn: the conversation comes with the request, so its thread is deleted after."""
    thread = uuid.uuid4().hex
    try:
        return await runtime.agent.ask(question, thread, history=history, cache_salt=salt,
                                       max_answer_tokens=max_tokens)
    finally:
        with anyio.CancelScope(shield=True):  # a gone client's stream is cancelled: the delete must still run
            await runtime.saver.adelete_thread(thread)


def _sse(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _agent_sse(runtime: Runtime, metrics: Metrics, message: str, key: str, public: str, salt: str | None,
                     payload: Callable, claimed: Callable) -> AsyncIterator[str]:
    started = time.perf_counter()
    try:
        with claimed(key):
            async for event in runtime.agent.stream(message, key, cache_salt=salt):
                if event.kind == "token":
                    yield _sse("token", {"text": event.text})
                elif event.kind == "node":
                    keep = ("gates", "ask", "error")
                    yield _sse("node", {"node": event.node, **{k: v for k, v in event.data.items() if k in keep}})
                else:
                    _record_turn(metrics, event.result, started)
                    yield _sse("final", payload(event.result, public))
    except ApiError as exc:
        yield _sse("error", {"message": exc.message, "code": exc.status})
    except DegenerateOutput as exc:  # the answer so far was sent; the rest failed the guard
        yield _sse("degenerate_output", {"message": str(exc), "reason": exc.trip.reason, "code": 502})
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error is an event, then the end
        log.exception("agent stream failed")
        runtime.trouble()
        yield _sse("error", {"message": f"{type(exc).__name__}: {exc}", "code": 500})


async def _openai_agent_sse(runtime: Runtime, metrics: Metrics, model: str, completion_id: str, question: str,
                            history: list[Turn], salt: str | None, max_tokens: int | None) -> AsyncIterator[str]:
    started, thread = time.perf_counter(), uuid.uuid4().hex
    yield _chunk(completion_id, model, {"role": "assistant", "content": ""}, None)
    try:
        async for event in runtime.agent.stream(question, thread, history=history, cache_salt=salt,
                                                max_answer_tokens=max_tokens):
            if event.kind == "token":
                yield _chunk(completion_id, model, {"content": event.text}, None)
            elif event.kind == "final":
                result = event.result
                _record_turn(metrics, result, started)
                if result.error:  # no answer: an error event, as OpenAI streams report errors
                    yield _error_chunk(result.error, "retrieval_error", 502)
                    return
                if result.decision != "answer" and result.answer:  # a refusal is said, not generated
                    yield _chunk(completion_id, model, {"content": result.answer}, None)
                extra = {"decision": result.decision, "gates": result.gates, "sources": result.sources}
                yield _chunk(completion_id, model, {}, _finish(result.finish_reason), extra)
        yield "data: [DONE]\n\n"
    except DegenerateOutput as exc:
        yield _error_chunk(str(exc), "degenerate_output", 502)
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error is a chunk
        log.exception("completion stream failed")
        runtime.trouble()
        yield _error_chunk(f"{type(exc).__name__}: {exc}", "server_error", 500)
    finally:
        with anyio.CancelScope(shield=True):  # a gone client's stream is cancelled: the delete must still run
            await runtime.saver.adelete_thread(thread)


def _error_chunk(message: str, kind: str, code: int) -> str:
    return f"data: {json.dumps({'error': {'message': message, 'type': kind, 'code': code}})}\n\n"


async def _openai_plain_sse(runtime: Runtime, metrics: Metrics, model: str, completion_id: str, prompt: list[int],
                            sampling: dict) -> AsyncIterator[str]:
    started, text, first, finish = time.perf_counter(), "", True, None
    yield _chunk(completion_id, model, {"role": "assistant", "content": ""}, None)
    try:
        async for out in runtime.generator.stream(prompt, **sampling):
            if out.text != text:
                if first:
                    metrics.ttft.observe(time.perf_counter() - started)
                    first = False
                yield _chunk(completion_id, model, {"content": out.text[len(text):]}, None)
                text = out.text
            finish = out.finish_reason
    except DegenerateOutput as exc:
        yield _error_chunk(str(exc), "degenerate_output", 502)
        return
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error is a chunk
        log.exception("completion stream failed")
        runtime.trouble()
        yield _error_chunk(f"{type(exc).__name__}: {exc}", "server_error", 500)
        return
    yield _chunk(completion_id, model, {}, _finish(finish))
    yield "data: [DONE]\n\n"
