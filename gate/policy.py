"""Threshold policy: the gate's three probabilities -> one decision.

`answer` if p_answer >= t_answer, else `refuse` if p_refuse >= t_refuse, else `search`.
Answering is checked first because it is the only decision that shows the user model text
built on the documents; `search` is the fallback because it is the only one that can recover.
This module does not compute probabilities; the engine and the HF reference do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from gatehead.errors import InvalidInput

Decision = Literal["answer", "refuse", "search"]
LABELS: tuple[Decision, ...] = ("answer", "refuse", "search")


@dataclass(frozen=True)
class Thresholds:
    """Per-class thresholds of the policy; both lie in [0, 1]."""

    answer: float = 0.5
    refuse: float = 0.5

    def __post_init__(self) -> None:
        for name in ("answer", "refuse"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise InvalidInput(f"threshold {name!r} must be a number in [0, 1], got {value!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> Thresholds:
        unknown = set(data) - {"answer", "refuse"}
        if unknown:
            raise InvalidInput(f"unknown threshold(s) {sorted(unknown)}: only 'answer' and 'refuse' are set")
        return cls(**data)

    def to_dict(self) -> dict[str, float]:
        return {"answer": self.answer, "refuse": self.refuse}


@dataclass(frozen=True)
class GateResult:
    """Probabilities of the three classes and the decision the thresholds give."""

    probs: dict[Decision, float]
    decision: Decision
    thresholds: Thresholds


def decide(probs: Mapping[str, float], thresholds: Thresholds) -> Decision:
    """The decision for `probs` (keyed by label) under `thresholds`."""
    missing = set(LABELS) - set(probs)
    if missing:
        raise ValueError(f"probabilities lack label(s) {sorted(missing)}")
    if any(not math.isfinite(p) for p in probs.values()):
        raise ValueError(f"probabilities must be finite, got {dict(probs)}")
    if probs["answer"] >= thresholds.answer:
        return "answer"
    if probs["refuse"] >= thresholds.refuse:
        return "refuse"
    return "search"


def decide_all(probs: Sequence[Sequence[float]], thresholds: Thresholds) -> list[Decision]:
    """The decision for each row of probabilities (columns in LABELS order)."""
    return [decide(dict(zip(LABELS, row, strict=True)), thresholds) for row in probs]


def gate_result(probs: Mapping[str, float], thresholds: Thresholds) -> GateResult:
    """Bundle `probs` with the decision they give under `thresholds`."""
    clean: dict[Decision, float] = {label: float(probs[label]) for label in LABELS if label in probs}
    return GateResult(probs=clean, decision=decide(clean, thresholds), thresholds=thresholds)
