"""Fidelity per DESIGN's judging rules, on the tiny model in the host's dtype (bf16 where native, else fp32):
answer stability and gate agreement."""

from __future__ import annotations

import numpy as np
import pytest

from gatehead.evals.agreement import agreement, dedicated_gate_probs, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_prompts
from gatehead.gate.policy import decide_all
from gatehead.runtime.dedicated import export_dedicated
from gatehead.runtime.engine import SharedEngine
from gatehead.tiny import TinyModel

N_STABILITY = 64
N_AGREEMENT = 256


@pytest.fixture(scope="module")
def perturbed_eager(engines) -> SharedEngine:
    """The negative control: `shared_eager` but for a tap that writes its rounding back into the stream."""
    return engines(tap="perturbed")


@pytest.mark.parametrize("mixed", [False, True], ids=["plain", "mixed"])
def test_stability_eager(stock_eager, shared_eager, loop, record_figure, mixed: bool) -> None:
    answers = synthetic_prompts(shared_eager.prompts, N_STABILITY, 1, "answer")
    gates = synthetic_prompts(shared_eager.prompts, N_STABILITY, 2, "gate") if mixed else []
    result = loop.run(check_stability(stock_eager, shared_eager, answers, 128, gates))
    mix = f", {N_STABILITY} gates mixed in" if mixed else ""
    record_figure(f"tiny/stability/eager-{'mixed' if mixed else 'plain'}",
                  f"answer stability, eager, {N_STABILITY} x 128 tokens{mix}", result)
    assert result.passed, result


def test_perturbed_tap_fails_the_stability_check(stock_eager, perturbed_eager, loop, record_figure) -> None:
    answers = synthetic_prompts(perturbed_eager.prompts, N_STABILITY, 1, "answer")
    result = loop.run(check_stability(stock_eager, perturbed_eager, answers, 128))
    record_figure("tiny/stability/perturbed", "negative control: a tap that writes its bf16 rounding back "
                  "into the stream (must fail)", result)
    assert not result.passed
    assert result.shared_vs_stock.differing > result.stock_vs_stock.differing


def test_gate_agreement_with_dedicated_engine_and_references(shared_eager, loop, tiny: TinyModel, tmp_path,
                                                             record_figure, record_agreement, hf_references) -> None:
    """A random adapter's decisions sit on its thresholds, so flips say nothing here: judged on |dp| alone.

    Every bound is this machine's own reference, measured in the same run: results depend on the CPU's
    kernels (AMX, AVX-512 BF16; fp32 on AVX-512F or AVX2). Flips are judged on the trained demo gate
    (`test_demo_fidelity.py`).
    """
    gates = synthetic_prompts(shared_eager.prompts, N_AGREEMENT, 3, "gate")
    generations = synthetic_prompts(shared_eager.prompts, 32, 4, "answer")
    shared = loop.run(shared_gate_probs(shared_eager, gates, generations))
    dtype = shared_eager.config.dtype
    export = export_dedicated(tiny.model_dir, tiny.adapter_dir, tmp_path / "dedicated", dtype=dtype)
    dedicated = dedicated_gate_probs(export, gates, tiny.adapter.spec.labels, dtype=dtype,
                                     kv_cache_memory_bytes=128 << 20, enforce_eager=True, max_model_len=1024)
    refs = hf_references(tiny.model_dir, tiny.adapter_dir, gates, dtype)
    thresholds = tiny.adapter.spec.thresholds
    vs_dedicated = agreement(shared, dedicated, thresholds)
    bounds = record_agreement("tiny", f"{N_AGREEMENT} gates mixed with 32 generations", thresholds,
                              shared=shared, dedicated=dedicated, **refs)
    assert all(figure <= bound for figure, bound in bounds.values()), bounds
    assert np.allclose(shared.sum(axis=1), 1.0, atol=1e-5)
    # Flips: only where a threshold lies within the two engines' measured distance of the shared engine's
    # probability (the shared-vs-dedicated bound), the only place two roundings of one gate may decide apart.
    noise = bounds["shared vs dedicated, max |dp|"][1]
    margin = np.minimum(np.abs(shared[:, 0] - thresholds.answer), np.abs(shared[:, 1] - thresholds.refuse))
    decided = [decide_all(p.tolist(), thresholds) for p in (shared, dedicated)]
    flipped = [i for i, (a, b) in enumerate(zip(*decided, strict=True)) if a != b]
    record_figure("tiny/agreement/near-threshold", "gate, shared vs dedicated flips and gates within the "
                  "shared-vs-dedicated bound of a threshold", {"flips": len(flipped), "gates": len(gates),
                  "noise": noise, "within_noise": int((margin <= noise).sum())})
    assert all(margin[i] <= noise for i in flipped), [(i, margin[i]) for i in flipped]
    assert len(flipped) == vs_dedicated.flips
