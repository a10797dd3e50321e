"""Classification metrics for the gate: accuracy, per-class precision/recall/F1, confusion, calibration error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gatehead.gate.policy import LABELS


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of [n, classes] logits."""
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class ClassMetrics:
    """Metrics of predicted vs true label indices (into LABELS)."""

    accuracy: float
    precision: dict[str, float]
    recall: dict[str, float]
    f1: dict[str, float]
    confusion: list[list[int]]  # rows: true label, columns: predicted label, in LABELS order
    support: dict[str, int]


def classification_metrics(true: Sequence[int], predicted: Sequence[int]) -> ClassMetrics:
    n = len(LABELS)
    confusion = np.zeros((n, n), dtype=int)
    for t, p in zip(true, predicted, strict=True):
        confusion[t, p] += 1
    precision, recall, f1 = {}, {}, {}
    for i, label in enumerate(LABELS):
        tp = confusion[i, i]
        p = tp / confusion[:, i].sum() if confusion[:, i].sum() else 0.0
        r = tp / confusion[i].sum() if confusion[i].sum() else 0.0
        precision[label], recall[label] = float(p), float(r)
        f1[label] = float(2 * p * r / (p + r)) if p + r else 0.0
    accuracy = float(np.trace(confusion) / max(confusion.sum(), 1))
    support = {label: int(confusion[i].sum()) for i, label in enumerate(LABELS)}
    return ClassMetrics(accuracy, precision, recall, f1, confusion.tolist(), support)


def expected_calibration_error(true: Sequence[int], probs: np.ndarray, bins: int = 10) -> float:
    """ECE of the top-class probability over equal-width confidence bins."""
    confidence, predicted = probs.max(axis=1), probs.argmax(axis=1)
    correct = predicted == np.asarray(true)
    edges = np.linspace(0.0, 1.0, bins + 1)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (confidence > lo) & (confidence <= hi)
        if inside.any():
            ece += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    return float(ece)
