"""Fidelity on the trained demo model and gate, where decisions spread over all three classes and flips mean something.

Same judging rules as `test_fidelity.py` (tiny random model), on the demo model: 16 answer requests of 64
tokens mixed with 16 gate requests for stability (32 and 32 until 2026-12-06, when the suite ran over its
budget on an AVX2 host; `gatehead figures --only eval-stability` runs 64 on this model), and `demo_gates`
(256 gate requests where bf16 is native, 128 on an fp32 host: tests/conftest.py) mixed with 32 generations for
agreement. The requests are the demo's held-out (validation) questions with the documents the real retriever
returned for them.
"""

from __future__ import annotations

import numpy as np
import pytest

from gatehead.demo.splits import held_out_examples
from gatehead.evals.agreement import agreement, dedicated_gate_probs, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.gate.adapter import load_gate_adapter
from gatehead.runtime.dedicated import export_dedicated
from gatehead.runtime.engine import SharedEngine
from gatehead.testing import demo_kit

MODEL_DIR, ADAPTER_DIR, _ = demo_kit()

MAX_LEN = 2048


@pytest.fixture(scope="module")
def held_out() -> list:
    """The demo's held-out questions (test, then val) with their retrieved documents."""
    return held_out_examples()


def built(engine: SharedEngine, examples, kind: str) -> list[tuple[int, ...]]:
    return [getattr(engine.prompts.build(e.question, e.passages, e.conversation), kind) for e in examples]


def test_demo_stability_with_gates_in_the_batches(demo_stock, demo_shared, held_out, loop, record_figure) -> None:
    """The trained model's answers are bit-identical to stock vLLM's with gate requests in the same batches.
    (Without gates, and in compile mode, the tiny model checks the same: test_fidelity*.py.)"""
    answers = built(demo_shared, held_out[:16], "answer")
    gates = built(demo_shared, held_out[16:32], "gate")
    result = loop.run(check_stability(demo_stock, demo_shared, answers, 64, gates))
    record_figure("demo/stability/mixed", "answer stability, 16 held-out questions x 64 tokens, 16 gates mixed in",
                  result)
    assert result.passed, result


def test_demo_gate_agreement(demo_shared, demo_gates, demo_references, held_out, loop, tmp_path,
                             record_agreement) -> None:
    adapter = load_gate_adapter(ADAPTER_DIR, MODEL_DIR)
    gates = demo_gates
    generations = built(demo_shared, held_out[256:288], "answer")
    shared = loop.run(shared_gate_probs(demo_shared, gates, generations))
    # The dedicated engine in the shared engine's dtype (the host's: bf16 where native, else fp32).
    export = export_dedicated(MODEL_DIR, ADAPTER_DIR, tmp_path / "dedicated", dtype=demo_shared.config.dtype)
    dedicated = dedicated_gate_probs(export, gates, adapter.spec.labels, dtype=demo_shared.config.dtype,
                                     enforce_eager=True, kv_cache_memory_bytes=256 << 20, max_model_len=MAX_LEN)
    fp32, same, merged = demo_references["fp32"], demo_references["same"], demo_references["merged"]
    thresholds = adapter.spec.thresholds
    vs_dedicated, vs_fp32 = agreement(shared, dedicated, thresholds), agreement(shared, fp32, thresholds)
    dedicated_vs_fp32 = agreement(dedicated, fp32, thresholds)
    bounds = record_agreement("demo", f"{len(gates)} held-out gates mixed with 32 generations", thresholds,
                              shared=shared, dedicated=dedicated, fp32=fp32, same=same, merged=merged)
    assert len(vs_dedicated.mix_a) == 3, f"the demo gate should use all three decisions: {vs_dedicated.mix_a}"
    # Decisions: the same as stock vLLM's classifier, and no more of them wrong against fp32 than it gets wrong.
    assert vs_dedicated.flips == 0, vs_dedicated
    assert vs_fp32.flips <= dedicated_vs_fp32.flips, (vs_fp32, dedicated_vs_fp32)
    assert all(figure <= bound for figure, bound in bounds.values()), bounds
    assert np.allclose(shared.sum(axis=1), 1.0, atol=1e-5)
