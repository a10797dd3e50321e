"""Gate results do not depend on how the prompt reaches the branch: chunked, uncached, preempted."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gatehead.evals.workload import synthetic_requests
from gatehead.runtime.dtype import resolve_dtype
from gatehead.runtime.engine import SharedEngine

# tokens x layers x (K, V) x kv heads x head dim x bytes of the host's dtype
BLOCK_BYTES = 32 * 6 * 2 * 2 * 32 * {"bfloat16": 2, "float32": 4}[resolve_dtype("auto")]


def probs_of(outcomes) -> np.ndarray:
    return np.array([[o.result.probs[k] for k in ("answer", "refuse", "search")] for o in outcomes])


@pytest.fixture(scope="module")
def cramped(engines) -> SharedEngine:
    """64-token steps (prompts split over several), no prefix caching, KV for ~24 blocks (preemption)."""
    return engines(max_num_batched_tokens=64, max_num_seqs=16, enable_prefix_caching=False,
                   kv_cache_memory_bytes=24 * BLOCK_BYTES, max_model_len=512)


def test_chunked_uncached_and_preempted_prompts_give_the_same_probabilities(cramped, shared_eager, loop,
                                                                            record_figure) -> None:
    def preemptions() -> float:
        return loop.run(cramped.stats())["preemptions"]

    requests = synthetic_requests(24, seed=5)
    gates = [shared_eager.prompts.build(r.question, r.passages, r.conversation).gate for r in requests]
    assert max(len(g) for g in gates) > 2 * 64, "prompts must span several 64-token steps"
    answers = [shared_eager.prompts.build(r.question, r.passages).answer for r in synthetic_requests(12, seed=6)]
    async def default():
        return await asyncio.gather(*(shared_eager.gate_prompt(g) for g in gates))

    expected = probs_of(loop.run(default()))

    async def crowded():
        work = [cramped.gate_prompt(g) for g in gates]
        work += [cramped.generate(a, max_tokens=96, ignore_eos=True) for a in answers]
        return (await asyncio.gather(*work))[: len(gates)]

    before = preemptions()
    got = probs_of(loop.run(crowded()))
    preempted = preemptions() - before
    delta = np.abs(got - expected).max()
    record_figure("tiny/chunked", f"gate, {len(gates)} prompts in 64-token steps, uncached and preempted, vs "
                  "the default engine", {"max_dp": float(delta), "preemptions": int(preempted)})
    assert preempted > 0, "the KV pool was meant to force preemption"
    assert delta <= 1e-3
