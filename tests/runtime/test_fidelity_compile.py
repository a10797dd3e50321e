"""Answer stability in vLLM's compile mode (the default), where the tap op sits inside the compiled graph."""

from __future__ import annotations

import pytest

from gatehead.evals.agreement import agreement, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_requests
from gatehead.runtime.tiny import TinyModel


@pytest.fixture(scope="module")
def compiled(engines):
    return engines(gate=False, enforce_eager=False), engines(enforce_eager=False)


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "mixed"])
def test_stability_compiled(compiled, loop, mixed: bool) -> None:
    stock, shared = compiled
    built = [shared.prompts.build(r.question, r.passages, r.conversation) for r in synthetic_requests(64, seed=1)]
    gates = [shared.prompts.build(r.question, r.passages).gate for r in synthetic_requests(64, seed=2)] if mixed else []
    result = loop.run(check_stability(stock, shared, [b.answer for b in built], 128, gates))
    print(f"compile {'mixed' if mixed else 'plain'}: {result}")
    assert result.passed, result


def test_compiled_gate_is_the_eager_gate_within_bf16_rounding(compiled, shared_eager, loop, tiny: TinyModel,
                                                              fp32_judge) -> None:
    """Compile mode fuses the base's ops differently, and the tap sits inside the compiled graph: the gate
    may move by the base's bf16 rounding, no more than bf16 itself moves it (HF bf16 vs fp32, this run)."""
    _, shared = compiled
    gates = [shared.prompts.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(128, 7)]
    probs = loop.run(shared_gate_probs(shared, gates))
    vs_eager = agreement(probs, loop.run(shared_gate_probs(shared_eager, gates)), tiny.adapter.spec.thresholds)
    vs_fp32, floor = fp32_judge(probs, tiny, gates)
    print(f"compiled vs eager shared: {vs_eager}\ncompiled shared vs HF fp32: {vs_fp32}\nHF bf16 vs HF fp32: {floor}")
    # A random adapter's decisions sit on its thresholds: judged on |dp| alone (flips are printed).
    assert vs_eager.max_dp <= floor.max_dp and vs_eager.mean_dp <= floor.mean_dp, (vs_eager, floor)
