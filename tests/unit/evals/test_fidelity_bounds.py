"""The fidelity bounds when HF's own-rounding reference (`same`) measures some gates only."""

from __future__ import annotations

import numpy as np
import pytest

from gatehead.evals.agreement import ROUNDINGS, fidelity_bounds, measured, no_further_from_fp32


def _gates(n: int, rng: np.random.Generator, scale: float, around: np.ndarray) -> np.ndarray:
    moved = around + rng.normal(0, scale, around.shape)
    return moved / moved.sum(axis=1, keepdims=True)


def test_a_reference_on_every_second_gate_gives_bounds_no_looser_at_the_max() -> None:
    rng = np.random.default_rng(0)
    fp32 = rng.dirichlet((1, 1, 1), 64)
    shared, dedicated, same, merged = (_gates(64, rng, s, fp32) for s in (1e-6, 2e-6, 1e-6, 1e-6))
    full = fidelity_bounds(shared, dedicated, fp32, same, merged)
    half = same.copy()
    half[1::2] = np.nan
    assert measured(half).tolist() == [i % 2 == 0 for i in range(64)]
    assert measured(shared, half).sum() == 32 and measured(shared, dedicated).all()
    bounds = fidelity_bounds(shared, dedicated, fp32, half, merged)
    for name, (figure, bound) in bounds.items():
        assert np.isfinite(bound) and figure == full[name][0]  # figures over every gate, as before
        if "max" in name:
            assert bound <= full[name][1]  # the largest move over fewer gates is never larger


def test_only_the_same_dtype_reference_may_miss_gates() -> None:
    rng = np.random.default_rng(1)
    fp32 = rng.dirichlet((1, 1, 1), 8)
    shared, dedicated, same, merged = (_gates(8, rng, 1e-6, fp32) for _ in range(4))
    broken = shared.copy()
    broken[3] = np.nan
    with pytest.raises(ValueError, match="the shared probabilities are not finite on every gate"):
        fidelity_bounds(broken, dedicated, fp32, same, merged)
    with pytest.raises(ValueError, match="measured no gate"):
        fidelity_bounds(shared, dedicated, fp32, np.full_like(same, np.nan), merged)


def _strayed(fp32: np.ndarray, strays: np.ndarray) -> np.ndarray:
    """`fp32` with each gate's first two classes moved by its stray (its largest class |dp| from fp32)."""
    moved = fp32.copy()
    moved[:, 0] += strays
    moved[:, 1] -= strays
    return moved


def test_the_max_bounds_allow_two_roundings_and_the_mean_bounds_none() -> None:
    rng = np.random.default_rng(2)
    fp32 = rng.dirichlet((5, 5, 5), 128)
    reference = rng.exponential(1e-7, 128)
    reference[7] = 4e-6  # the long tail: one gate strays far
    dedicated, merged = _strayed(fp32, reference), _strayed(fp32, rng.exponential(4e-8, 128))  # HF's noise
    same = fp32.copy()

    def checks(strays: np.ndarray) -> dict[str, bool]:
        bounds = no_further_from_fp32(_strayed(fp32, strays), dedicated, fp32, same, merged)
        return {name.split(", ")[1]: figure <= bound for name, (figure, bound) in bounds.items()}

    # An equally good computation whose largest stray falls on another gate, 1.8 times the reference's: it holds.
    equal = rng.permutation(reference)
    equal[equal.argmax()] = 1.8 * reference.max()
    equal[7] = reference.mean()
    assert ROUNDINGS == 2 and checks(equal) == {"max |dp|": True, "mean |dp|": True}
    # Past two roundings at one gate, or worse throughout: each fails its bound.
    assert checks(np.where(np.arange(128) == 3, 2.2 * reference.max(), reference))["max |dp|"] is False
    assert checks(reference * 1.5) == {"max |dp|": True, "mean |dp|": False}
