"""What tests stand on: the demo kit for the tests that run the demo model, and a scripted engine and store
for the fast tier. (Tiny random models, which the CLI and benchmarks build too, are `gatehead.tiny`.)

`ScriptedEngine` and `ScriptedStore` stand in for the shared engine and the Qdrant store where the
point is routing and error handling (an agent graph's routes, the service's error paths): the
engine lays prompts out with the real `PromptBuilder` and answers gates as a test scripts them, with
no vLLM; both record every call.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatehead.gate.policy import Thresholds, gate_result
from gatehead.gate.prompt import PromptBuilder, PromptConfig


def demo_kit() -> tuple[Path, Path, Path]:
    """(model, prompt-mode gate, suffix-mode gate) of the demo, the model built on first use."""
    from gatehead import demo
    from gatehead.demo.base import ensure_demo_model

    return ensure_demo_model(), demo.ADAPTER_DIR, demo.SUFFIX_ADAPTER_DIR


# ----- the scripted engine and store ------------------------------------------------------------

SCRIPTED_PROBS = {"answer": {"answer": 0.9, "refuse": 0.05, "search": 0.05},
                  "refuse": {"answer": 0.05, "refuse": 0.9, "search": 0.05},
                  "search": {"answer": 0.1, "refuse": 0.1, "search": 0.8}}


@dataclass
class ScriptedEngine:
    """An engine with `SharedEngine`'s interface and no model: gates decide as `decisions` says, in order
    ("answer" when they run out); generations say `rewrite` (whole) or stream `answer` word by word.

    Hooks for failure paths: `fail` (an exception every gate and generation raises), `hold` (an event
    every call waits for first: a request that stays in flight), `cancelled` (calls cancelled while
    held), `gate_seconds` (how long a gate takes: what a stream beside it makes meanwhile). `calls`
    records (method, keyword arguments) of every call; `streamed` the tokens each stream yielded.
    """

    tokenizer: Any
    adapter: Any
    decisions: list[str] = field(default_factory=list)
    answer: str = "The warranty lasts two years [1]."
    rewrite: str = "warranty period of the Vale Lantern"
    max_model_len: int = 1024
    fail: BaseException | None = None
    hold: asyncio.Event | None = None
    calls: list[tuple[str, dict]] = field(default_factory=list)
    cancelled: int = 0
    gate_seconds: float = 0.0
    streamed: list[int] = field(default_factory=list)
    alive: bool = True

    def __post_init__(self) -> None:
        self.prompts: PromptBuilder | None = PromptBuilder(self.tokenizer, self.adapter.spec.suffix,
                                                           PromptConfig(max_context=self.max_model_len))
        self.gate_reserved = frozenset()

    async def _enter(self, method: str, kwargs: dict) -> None:
        self.calls.append((method, kwargs))
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.fail is not None:
            raise self.fail

    async def gate(self, question, passages=(), conversation=(), *, thresholds=None, cache_salt=None):
        from gatehead.runtime.engine import GateOutcome

        prompt = self.prompts.build(question, passages, conversation)
        await self._enter("gate", {"question": question, "passages": len(passages), "cache_salt": cache_salt})
        await asyncio.sleep(self.gate_seconds)
        decision = self.decisions.pop(0) if self.decisions else "answer"
        result = gate_result(SCRIPTED_PROBS[decision], thresholds or Thresholds(0.5, 0.5))
        return GateOutcome(result, prompt, len(prompt.gate), 0)

    async def generate(self, prompt: Sequence[int], **kwargs: Any):
        from gatehead.runtime.engine import Generation

        await self._enter("generate", kwargs)
        return Generation([1, 2], self.rewrite, [0.0, 0.0], "stop", 0)

    async def stream(self, prompt: Sequence[int], **kwargs: Any) -> AsyncIterator[Any]:
        from gatehead.runtime.engine import Generation

        await self._enter("stream", kwargs)
        words = self.answer.split(" ")
        self.streamed.append(0)
        for n in range(1, len(words) + 1):
            await asyncio.sleep(0)  # a step apart, as an engine's outputs come
            self.streamed[-1] = n
            yield Generation(list(range(n)), " ".join(words[:n]), [0.0] * n, "stop" if n == len(words) else None,
                             len(prompt) - 1)

    async def warm_up(self) -> None:
        await self._enter("warm_up", {})

    def check_length(self, ids: Sequence[int], max_tokens: int) -> None:
        from gatehead.runtime.engine import SharedEngine

        SharedEngine.check_length(self, ids, max_tokens)  # the engine's own check, on this max_model_len

    async def stats(self) -> dict[str, float]:
        return {"running": 0, "waiting": 0}

    def shutdown(self) -> None:
        self.alive = False


class ScriptedStore:
    """A retriever of one fixed document; `fail` makes every search raise. `queries` records the searches."""

    DOCUMENT = {"text": "The Vale Lantern has a 2-year warranty.", "title": "Vale Lantern", "source": "vale.md"}

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.queries, self.closed = fail, [], False

    def search(self, query: str, top_k: int = 3) -> list[dict]:
        self.queries.append(query)
        if self.fail:
            raise ConnectionError("the store went away")
        return [self.DOCUMENT][:top_k]

    def ping(self) -> None:
        if self.fail:
            raise ConnectionError("the store went away")

    def close(self) -> None:
        self.closed = True


def cited(answer: str, sources: Sequence[str], dropped: Sequence[str] = ()) -> list[str]:
    """The sources an answer's `[n]` markers point at: the prompt numbers the passages it kept from 1, in order
    (`dropped`: the sources, or indices, the context budget left out). A marker past them stays "[n]?".

    What a test of a trained model checks instead of the model's exact words: the fact, and where it
    says the fact came from."""
    kept = [s for i, s in enumerate(sources) if s not in dropped and str(i) not in dropped]
    return [kept[int(n) - 1] if 0 < int(n) <= len(kept) else f"[{n}]?" for n in re.findall(r"\[(\d+)\]", answer)]


def states(answer: str, fact: str) -> bool:
    """`fact` appears in `answer` as a whole: "€64" is in "costs €64 [1]", not in "€640"."""
    return re.search(rf"(?<![\w]){re.escape(fact)}(?![\w])", answer) is not None
