"""What the service holds: the engine, store, threads and agent built once, and the state every request shares.

`Services.start` opens the backends (`open_backends`: the Qdrant store with its corpus, the shared
engine, or a `RemoteEngine` on `ServerConfig.vllm_urls`, and the checkpointer), puts generations behind
the degenerate-output guard, builds the agent, runs the engine's warm-up (a generation and a gate) and
records the canaries. Until it has, the service is not ready. A test passes its own opener to run the
service on a scripted engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gatehead.agent import Agent
from gatehead.agent.context import Engine
from gatehead.runtime.canary import Canaries, CanaryGroup, watching
from gatehead.runtime.guard import GuardCounters, GuardedEngine
from gatehead.server.config import ServerConfig
from gatehead.server.errors import ApiError
from gatehead.server.metrics import Metrics

log = logging.getLogger("gatehead.server")


@dataclass(frozen=True)
class Backends:
    """What the service runs on. `engine` is a `SharedEngine` (or anything with its methods the routes use:
    gate, generate, stream, tokenizer, prompts, max_model_len, alive, stats); `store` a `Store`
    (search, ping); `saver` a LangGraph async checkpointer."""

    engine: Any
    store: Any
    saver: Any


Opener = Callable[[ServerConfig, contextlib.AsyncExitStack], Awaitable[Backends]]


async def open_backends(config: ServerConfig, stack: contextlib.AsyncExitStack) -> Backends:
    """The store (its corpus ingested), the shared engine and the checkpointer, each closed by `stack`."""
    from gatehead.agent.checkpoint import default_checkpoint_path, open_checkpointer
    from gatehead.retrieval.ingest import open_store
    from gatehead.runtime.engine import SharedEngine

    store = await asyncio.to_thread(open_store, config.store, config.corpus, None, log.info)
    stack.callback(store.close)
    if config.vllm_urls:
        engine = await remote_engine(config)
        stack.push_async_callback(engine.aclose)
    else:
        engine = await asyncio.to_thread(SharedEngine, config.engine)
        stack.push_async_callback(asyncio.to_thread, engine.shutdown)
    saver = await stack.enter_async_context(open_checkpointer(config.threads
                                                              or str(default_checkpoint_path(config.store))))
    return Backends(engine, store, saver)


async def remote_engine(config: ServerConfig, wait: float = 600.0) -> Any:
    """A `RemoteEngine` on `config.vllm_urls` once every server passes its check (`RemoteEngine.check`), within
    `wait` seconds (servers started beside this one load their model meanwhile)."""
    from gatehead.runtime.remote import EngineUnavailable, RemoteConfig, RemoteEngine

    remote = RemoteConfig(urls=config.vllm_urls, model=config.engine.model, adapter=config.engine.adapter,
                          api_key=config.vllm_api_key, max_gate_tokens=config.engine.max_gate_tokens)
    deadline = asyncio.get_running_loop().time() + wait
    engine = None
    while True:
        try:
            engine = engine or await asyncio.to_thread(RemoteEngine, remote)
            states = await engine.check()
            if all(states.values()):
                return engine
            waiting = "; ".join(f"{s.url} ({s.last_error})" for s in engine.servers if not s.in_service)
        except EngineUnavailable as e:
            waiting = str(e)
        if asyncio.get_running_loop().time() > deadline:
            if engine is not None:
                await engine.aclose()
            raise EngineUnavailable(f"the vLLM servers did not all come up in {wait:.0f} s: {waiting}")
        log.info("waiting for the vLLM servers: %s", waiting)
        await asyncio.sleep(2.0)


class Services:
    """The service's parts and state. Routes reach it through `gatehead.server.deps`."""

    def __init__(self, config: ServerConfig, opener: Opener = open_backends) -> None:
        self.config, self.metrics, self._open = config, Metrics(), opener
        self.engine: Any = None  # gates go to the engine as it is
        self.generator: Engine | None = None  # generations: the engine behind the guard
        self.store: Any = None
        self.saver: Any = None
        self.agent: Agent | None = None
        self.guard = GuardCounters()
        self.canaries: Canaries | CanaryGroup | None = None
        self.ready = False
        self.draining = False
        self.failed: str | None = None
        self.inflight = 0
        self._busy: set[str] = set()  # threads with a turn running
        self._stack = contextlib.AsyncExitStack()

    @property
    def serving(self) -> bool:
        """Started, not failed, not draining: requests may be taken."""
        return self.ready and not self.failed and not self.draining

    def unavailable(self) -> str:
        """Why the service is not serving, for a 503."""
        return "shutting down" if self.draining else "failed to start" if self.failed else "starting"

    async def start(self) -> None:
        config = self.config
        try:
            backends = await self._open(config, self._stack)
            self.engine, self.store, self.saver = backends.engine, backends.store, backends.saver
            self.generator = GuardedEngine(self.engine, config.guard, self.guard)
            self.agent = Agent(self.generator, self.store, config.agent, self.saver)
            await self.engine.warm_up()  # the first forward's and the first gate's one-time costs
            if config.canary.enabled:
                self.canaries = watching(self.engine, config.canary)
                await self.canaries.record()
                self.guard.on_trip = self.canaries.poke
                watcher = asyncio.create_task(self.canaries.watch())
                self._stack.push_async_callback(_cancelled, watcher)
            self.ready = True
            log.info("gatehead is ready")
        except Exception as exc:  # noqa: BLE001 - reported by /readyz and /livez; the process stays inspectable
            self.failed = f"{type(exc).__name__}: {exc}"
            log.exception("gatehead failed to start")

    async def stop(self) -> None:
        self.ready = False
        await self._stack.aclose()

    def trouble(self) -> None:
        """An error a request met that a sick engine could cause: check the canaries now."""
        if self.canaries is not None:
            self.canaries.poke()

    @contextlib.contextmanager
    def claimed(self, thread: str) -> Iterator[None]:
        """One turn per thread at a time: 409 while another runs."""
        if thread in self._busy:
            raise ApiError(409, "this thread already has a turn running; wait for it to finish", "conflict")
        self._busy.add(thread)
        try:
            yield
        finally:
            self._busy.discard(thread)

    def record_turn(self, result) -> None:
        """A finished agent turn's gates, time to first token and decision, into the metrics."""
        for gate in result.gates:
            self.metrics.gate(gate["decision"], gate["probs"])
            self.metrics.wasted_answer_tokens.inc(gate.get("wasted_answer_tokens", 0))
        for timing in result.timings:
            if timing["node"] == "generate":
                self.metrics.ttft.observe(timing["ttft"])
        self.metrics.turns.labels(result.decision or "none").inc()


async def _cancelled(task: asyncio.Task) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
