"""Answer stability in vLLM's compile mode (the default), where the tap op sits inside the compiled graph."""

from __future__ import annotations

import numpy as np
import pytest

from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_requests
from gatehead.runtime.reference import HFReference
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


def test_compiled_gate_matches_reference(compiled, loop, tiny: TinyModel) -> None:
    _, shared = compiled
    requests = synthetic_requests(16, seed=7)
    outcomes = [loop.run(shared.gate(r.question, r.passages, r.conversation)) for r in requests]
    got = np.array([[o.result.probs[k] for k in ("answer", "refuse", "search")] for o in outcomes])
    reference = HFReference(tiny.model_dir, tiny.adapter_dir).gate_probs([o.prompt.gate for o in outcomes])
    assert np.abs(got - reference).max() < 0.02
