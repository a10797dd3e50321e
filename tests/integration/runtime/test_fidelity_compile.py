"""Answer stability in vLLM's compile mode (the default), where the tap op sits inside the compiled graph."""

from __future__ import annotations

import pytest

from gatehead.evals.agreement import agreement, no_further_from_fp32, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_requests
from gatehead.tiny import TinyModel


@pytest.fixture(scope="module")
def compiled(engines):
    return engines(gate=False, enforce_eager=False), engines(enforce_eager=False)


@pytest.mark.parametrize("mixed", [False, True, "suffix"], ids=["plain", "mixed", "mixed-suffix-mode"])
def test_stability_compiled(compiled, compiled_suffix, loop, record_figure, mixed: bool | str) -> None:
    stock, shared = compiled
    shared = compiled_suffix() if mixed == "suffix" else shared  # the suffix-mode gate on tiny's base
    built = [shared.prompts.build(r.question, r.passages, r.conversation) for r in synthetic_requests(64, seed=1)]
    gates = [shared.prompts.build(r.question, r.passages).gate for r in synthetic_requests(64, seed=2)] if mixed else []
    result = loop.run(check_stability(stock, shared, [b.answer for b in built], 128, gates))
    name = {False: "plain", True: "mixed", "suffix": "mixed-suffix-mode"}[mixed]
    mix = {False: "", True: ", 64 gates mixed in", "suffix": ", 64 suffix-mode gates mixed in"}[mixed]
    record_figure(f"tiny/stability/compile-{name}", f"answer stability, compile mode, 64 x 128 tokens{mix}", result)
    assert result.passed, result


def test_compiled_gate_is_no_further_from_fp32_than_eager(compiled, shared_eager, loop, tiny: TinyModel,
                                                         record_figure, hf_references) -> None:
    """Compile mode fuses the base's bf16 ops differently (the tap sits inside the compiled graph): the
    compiled gate is no further from fp32 than the eager one, beyond what one reordering of the same bf16
    sums moves a gate on this machine (HF bf16 merged vs unmerged), all measured in this run. A random
    adapter's decisions sit on its thresholds, so it is judged on |dp| alone (flips are printed)."""
    _, shared = compiled
    gates = [shared.prompts.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(128, 7)]
    compiled_probs, eager = (loop.run(shared_gate_probs(e, gates)) for e in (shared, shared_eager))
    refs = hf_references(tiny.model_dir, tiny.adapter_dir, gates, shared.config.dtype)
    bounds = no_further_from_fp32(compiled_probs, eager, refs["fp32"], refs["same"], refs["merged"], name="compiled")
    record_figure("tiny/compiled/vs-eager", "gate, compile mode vs eager (128 gates)",
                  agreement(compiled_probs, eager, tiny.adapter.spec.thresholds))
    record_figure("tiny/compiled/bounds", "gate, compile mode: no further from HF fp32 than eager (at the max, "
                  "twice), plus the merge's move (figure, bound)", bounds)
    assert all(value <= bound for value, bound in bounds.values()), bounds
