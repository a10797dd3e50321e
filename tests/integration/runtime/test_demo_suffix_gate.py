"""The demo's suffix-mode (activated) gate in the shared engine, in fp32 on every host: its probabilities are its
HF reference's within fp32's rule, cached or not, beside generations. (Its bf16 path is held to the bf16 rule
on the tiny model, `test_suffix_gate.py`: on the demo model a max-|dp| bound against HF bf16's own depends on
which prompts are asked, see below.)"""

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

# 64 gates (all three decisions among them, asserted below): the rule is a constant, not a largest move
# measured over the gates, and the HF fp32 reference costs 1.3 s a gate on one AVX2 core (128 until
# 2026-12-06, when the suite ran over its budget on an AVX2 host).
N = 64


@pytest.fixture(scope="module")
def demo_suffix():
    engine = SharedEngine(EngineConfig(model=MODEL_DIR, adapter=SUFFIX_ADAPTER_DIR, enforce_eager=True,
                                       memory_fraction=0.1, block_size=32, max_model_len=2048, dtype="float32"))
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
    thresholds = demo_suffix.adapter.spec.thresholds
    vs_fp32, cached_vs_fp32 = agreement(first, fp32, thresholds), agreement(again, fp32, thresholds)
    print(f"demo suffix gate (fp32) vs HF fp32: {vs_fp32}\ndemo suffix gate, prefixes cached, vs HF fp32: "
          f"{cached_vs_fp32}\ndemo suffix gate, cached vs first: {agreement(again, first, thresholds)}")
    assert len(vs_fp32.mix_a) == 3, f"the demo gate should use all three decisions: {vs_fp32.mix_a}"
    # The fp32 suffix gates' rule, as on the tiny model (test_suffix_gate.py): 1e-4 of HF fp32. Until
    # 2026-12-05 this test ran in the host's dtype against max(0.02, HF bf16's own max |dp|), on test-split
    # prompts; on validation prompts (the suite reads no test split) the bf16 engine measured max |dp| 0.154
    # (mean 0.0025, no flip) against HF bf16's 0.0715 (mean 0.0011), the same figures on the code before
    # that day's changes: one prompt whose answer/search split moved, a max over one set of prompts compared
    # with another computation's max, not a bound a correct bf16 engine meets on every set.
    for figures in (vs_fp32, cached_vs_fp32):
        assert figures.flips == 0 and figures.max_dp <= 1e-4, figures
    assert np.allclose(first.sum(axis=1), 1.0, atol=1e-5)
