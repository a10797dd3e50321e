"""The demo's suffix-mode (activated) gate in the shared engine, in the host's dtype: its decisions are its HF
reference's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gatehead.evals.agreement import agreement, shared_gate_probs
from gatehead.gate.policy import LABELS
from gatehead.gate.reference import HFReference
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.testing import demo_kit

MODEL_DIR, _, SUFFIX_ADAPTER_DIR = demo_kit()

N = 256


@pytest.fixture(scope="module")
def demo_suffix():
    engine = SharedEngine(EngineConfig(model=MODEL_DIR, adapter=SUFFIX_ADAPTER_DIR, enforce_eager=True,
                                       memory_fraction=0.1, block_size=32, max_model_len=2048))
    yield engine
    engine.shutdown()


def test_demo_suffix_gate_agrees_with_its_reference_cached_and_beside_generations(demo_suffix, loop) -> None:
    from gatehead.demo.splits import held_out_examples

    examples = held_out_examples()
    built = [demo_suffix.prompts.build(e.question, e.passages, e.conversation) for e in examples[:N]]
    gates = [b.gate for b in built]
    answers = [demo_suffix.prompts.build(e.question, e.passages).answer for e in examples[N:N + 32]]
    first = loop.run(shared_gate_probs(demo_suffix, gates, answers))
    async def cached():  # every prompt's prefix is cached now
        return await asyncio.gather(*(demo_suffix.gate_prompt(g) for g in gates))

    outcomes = loop.run(cached())
    assert all(o.num_cached_tokens > 0 for o in outcomes)
    again = np.array([[o.result.probs[label] for label in LABELS] for o in outcomes])
    fp32 = HFReference(MODEL_DIR, SUFFIX_ADAPTER_DIR, "float32").gate_probs(gates)
    dtype = demo_suffix.config.dtype  # the host's: bf16 where native, else fp32
    same = HFReference(MODEL_DIR, SUFFIX_ADAPTER_DIR, dtype).gate_probs(gates)
    thresholds = demo_suffix.adapter.spec.thresholds
    vs_fp32, cached_vs_fp32 = agreement(first, fp32, thresholds), agreement(again, fp32, thresholds)
    print(f"demo suffix gate vs HF fp32: {vs_fp32}\ndemo suffix gate, prefixes cached, vs HF fp32: {cached_vs_fp32}\n"
          f"demo suffix gate, cached vs first: {agreement(again, first, thresholds)}\n"
          f"demo HF {dtype} vs HF fp32 (suffix gate): {agreement(same, fp32, thresholds)}")
    assert len(vs_fp32.mix_a) == 3, f"the demo gate should use all three decisions: {vs_fp32.mix_a}"
    # 0.02 (issue 25), or the host dtype's own distance from fp32 on this machine where that is larger. Where
    # bf16 was emulated the engine measured 0.0198 (HF bf16 0.0161): vLLM's kernels there round toward zero in
    # the base forward the branch reads (docs/activated-gate-research.md); natively 0.0124. In fp32 (hosts
    # without native bf16) the fp32 suffix gates' bound: 1e-4 of HF fp32, as on the tiny model
    # (test_suffix_gate.py).
    bound = 1e-4 if dtype == "float32" else max(0.02, agreement(same, fp32, thresholds).max_dp)
    for figures in (vs_fp32, cached_vs_fp32):
        assert figures.flips == 0 and figures.max_dp <= bound, (figures, bound)
    assert np.allclose(first.sum(axis=1), 1.0, atol=1e-5)
