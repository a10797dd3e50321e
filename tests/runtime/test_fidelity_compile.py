"""Answer stability in vLLM's compile mode (the default), where the tap op sits inside the compiled graph."""

from __future__ import annotations

import pytest

from gatehead.evals.agreement import shared_gate_probs
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


def test_compiled_gate_agrees_with_fp32_as_well_as_hf_bf16_does(compiled, loop, tiny: TinyModel, fp32_judge) -> None:
    """Compile mode fuses the base's bf16 ops differently (the tap sits inside the compiled graph): the gate is
    no further from fp32 than HF's own bf16 gate, both measured in this run. A random adapter's decisions sit
    on its thresholds, so it is judged on |dp| alone (flips are printed)."""
    _, shared = compiled
    gates = [shared.prompts.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(128, 7)]
    engine, floor = fp32_judge(loop.run(shared_gate_probs(shared, gates)), tiny, gates)
    print(f"compiled shared vs HF fp32: {engine}\nHF bf16 vs HF fp32: {floor}")
    assert engine.max_dp <= floor.max_dp and engine.mean_dp <= floor.mean_dp, (engine, floor)
