"""Threshold policy: the decision order and threshold validation."""

import math

import pytest

from gatehead.gate.policy import Thresholds, decide, gate_result


def probs(a: float, r: float, s: float) -> dict[str, float]:
    return {"answer": a, "refuse": r, "search": s}


def test_answer_first_then_refuse_then_search() -> None:
    t = Thresholds(answer=0.5, refuse=0.4)
    assert decide(probs(0.5, 0.5, 0.0), t) == "answer"  # >= and answer checked first
    assert decide(probs(0.49, 0.4, 0.11), t) == "refuse"
    assert decide(probs(0.45, 0.39, 0.16), t) == "search"


def test_thresholds_overridable_per_call() -> None:
    p = probs(0.6, 0.3, 0.1)
    assert decide(p, Thresholds()) == "answer"
    assert decide(p, Thresholds(answer=0.9, refuse=0.25)) == "refuse"
    assert decide(p, Thresholds(answer=0.9, refuse=0.9)) == "search"


@pytest.mark.parametrize("bad", [-0.1, 1.01, math.nan, "0.5", True])
def test_thresholds_outside_unit_interval_are_rejected(bad) -> None:
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        Thresholds(answer=bad)


def test_unknown_threshold_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown threshold"):
        Thresholds.from_dict({"answer": 0.5, "serach": 0.2})


def test_missing_or_nan_probabilities_are_rejected() -> None:
    with pytest.raises(ValueError, match="lack label"):
        decide({"answer": 0.9}, Thresholds())
    with pytest.raises(ValueError, match="finite"):
        decide(probs(math.nan, 0.5, 0.5), Thresholds())


def test_gate_result_carries_probs_decision_and_thresholds() -> None:
    t = Thresholds(answer=0.7)
    result = gate_result(probs(0.6, 0.1, 0.3), t)
    assert result.decision == "search" and result.thresholds == t
    assert result.probs == probs(0.6, 0.1, 0.3)
