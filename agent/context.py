"""What the agent's nodes run on: the engine and retriever protocols, and the run context that carries them.

The nodes are module-level functions (`gatehead.agent.nodes`); they take the engine, the store and the
settings from LangGraph's run context (`AgentContext`), which is passed to every run and never written
to a checkpoint, so one compiled graph serves any engine and any tenant.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gatehead.agent.held import HeldAnswers
from gatehead.agent.state import AgentConfig
from gatehead.gate.policy import Thresholds
from gatehead.gate.prompt import Passage, PromptBuilder, Turn


class Retriever(Protocol):
    """What the agent retrieves with: `gatehead.retrieval.store.Store`, or anything with this method."""

    def search(self, query: str, top_k: int = ...) -> Sequence[Any]: ...


class Engine(Protocol):
    """What the agent asks of an engine: `gatehead.runtime.engine.SharedEngine` and the server's guarded
    engine (`gatehead.runtime.guard.GuardedEngine`) both are one, and so is a scripted engine in tests."""

    tokenizer: Any
    adapter: Any  # the gate adapter (its `spec.suffix` lays out the rewrite prompts)
    prompts: PromptBuilder | None  # None: no gate adapter, and no agent

    async def gate(self, question: str, passages: Sequence[Passage] = (), conversation: Sequence[Turn] = (), *,
                   thresholds: Thresholds | None = None, cache_salt: str | None = None) -> Any: ...

    async def generate(self, prompt: Sequence[int], **kwargs: Any) -> Any: ...

    def stream(self, prompt: Sequence[int], **kwargs: Any) -> AsyncIterator[Any]: ...


@dataclass(frozen=True)
class AgentContext:
    """One run's context: what the nodes run on, and this turn's own settings (never checkpointed)."""

    engine: Engine
    store: Retriever
    config: AgentConfig
    rewriter: PromptBuilder  # the rewrite and contextualize prompts' layout (the engine's window, REWRITE_SYSTEM)
    cache_salt: str | None = None  # keeps the turn's prefix-cache blocks to its tenant
    max_answer_tokens: int | None = None  # this turn's answer budget; default AgentConfig.max_answer_tokens
    affinity: str | None = None  # where an engine has several servers, the one this turn's requests go to
    held: HeldAnswers = field(default_factory=HeldAnswers)  # answers started beside their gate (one per run)

    @property
    def answer_tokens(self) -> int:
        return self.max_answer_tokens or self.config.max_answer_tokens
