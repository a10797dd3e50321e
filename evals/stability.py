"""Answer stability: greedy generations of the shared engine against the stock engine.

The rule (DESIGN): N greedy requests (max_tokens 128, ignore_eos), submitted together, run on the
stock engine twice and on the shared engine, prefix cache reset between passes. Count requests
with any differing token, the first differing positions, and max |delta logprob| over the tokens
both runs share. Pass iff shared-vs-stock differs in no more requests than stock-vs-stock, and,
where the stock repeats are bit-identical, the shared engine is bit-identical too.
Mixed batches: gate requests interleaved with the generations; the stock baseline interleaves
the same prompts as plain one-token requests that also skip reading the prefix cache.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from gatehead.runtime.engine import Generation, SharedEngine


@dataclass(frozen=True)
class Diff:
    """How two passes over the same prompts differ."""

    requests: int
    differing: int  # requests with any differing token
    first_positions: tuple[int, ...]  # first differing token position, per differing request
    max_abs_dlogprob: float  # over the tokens both passes agree on, up to the first difference

    @property
    def bit_identical(self) -> bool:
        return self.differing == 0 and self.max_abs_dlogprob == 0.0


@dataclass(frozen=True)
class StabilityResult:
    stock_vs_stock: Diff
    shared_vs_stock: Diff

    @property
    def passed(self) -> bool:
        if self.shared_vs_stock.differing > self.stock_vs_stock.differing:
            return False
        return self.shared_vs_stock.bit_identical or not self.stock_vs_stock.bit_identical


def compare(a: Sequence[Generation], b: Sequence[Generation]) -> Diff:
    """Token and logprob differences between two passes, request by request."""
    assert len(a) == len(b), "passes over different prompt sets"
    firsts, max_delta = [], 0.0
    for x, y in zip(a, b, strict=True):
        first = next((i for i, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if s != t), None)
        if first is None and len(x.token_ids) != len(y.token_ids):
            first = min(len(x.token_ids), len(y.token_ids))
        common = first if first is not None else len(x.token_ids)
        for p, q in zip(x.logprobs[:common], y.logprobs[:common], strict=False):
            max_delta = max(max_delta, abs(p - q))
        if first is not None:
            firsts.append(first)
    return Diff(len(a), len(firsts), tuple(firsts), max_delta)


async def _gate_like(engine: SharedEngine, ids: Sequence[int]) -> None:
    """On a stock engine: the same request shape as a gate request, without the gate."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, skip_reading_prefix_cache=True, detokenize=False)
    async for _ in engine.llm.generate({"prompt_token_ids": list(ids)}, params, request_id=f"like-{uuid.uuid4().hex}"):
        pass


async def generation_pass(engine: SharedEngine, prompts: Sequence[Sequence[int]], max_tokens: int = 128,
                          gate_prompts: Sequence[Sequence[int]] = ()) -> list[Generation]:
    """All `prompts` generated greedily, submitted together, interleaved with `gate_prompts` if any."""
    await engine.reset_prefix_cache()
    generations = [engine.generate(p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]
    gates = [engine.gate_prompt(g) if engine.adapter is not None else _gate_like(engine, g) for g in gate_prompts]
    interleaved = [c for pair in zip(generations, gates, strict=False) for c in pair]
    interleaved += generations[len(gates):] + gates[len(generations):]
    results = await asyncio.gather(*interleaved)
    return [r for r in results if isinstance(r, Generation)]


async def check_stability(stock: SharedEngine, shared: SharedEngine, prompts: Sequence[Sequence[int]],
                          max_tokens: int = 128, gate_prompts: Sequence[Sequence[int]] = ()) -> StabilityResult:
    """Stock twice, then shared, over the same prompts (and the same interleaved gate prompts)."""
    first = await generation_pass(stock, prompts, max_tokens, gate_prompts)
    second = await generation_pass(stock, prompts, max_tokens, gate_prompts)
    shared_pass = await generation_pass(shared, prompts, max_tokens, gate_prompts)
    return StabilityResult(compare(first, second), compare(first, shared_pass))
