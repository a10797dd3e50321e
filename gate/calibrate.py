"""Calibration: a temperature folded into the head, then thresholds chosen for a precision target.

1. Temperature scaling: the T minimising the validation NLL of softmax(logits / T); the head's
   weights are divided by T, so every engine serving the adapter gets calibrated probabilities.
2. Thresholds: among the answer thresholds whose answer-precision on the validation set meets the
   target, and every refuse threshold, the pair whose decisions have the best macro-F1 (ties: the
   lowest answer threshold, answering most). Both are written into `gate.json`. Taking the lowest
   answer threshold that meets the target, whatever it costs the other classes, answered questions
   that should have been refused: on the demo gate's validation set it cut refuse recall from 95.6%
   to 77.8%.
The adapter is rewritten in a temporary copy, validated, and only then swapped in.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gatehead.gate.adapter import ADAPTER_WEIGHTS, GATE_JSON, load_gate_adapter, replace_dir
from gatehead.gate.data import Example, gate_prompts
from gatehead.gate.metrics import ClassMetrics, classification_metrics, expected_calibration_error, softmax
from gatehead.gate.policy import LABELS, Thresholds, decide_all
from gatehead.gate.prompt import PromptBuilder, PromptConfig


@dataclass(frozen=True)
class CalibrationReport:
    temperature: float
    thresholds_before: Thresholds
    thresholds_after: Thresholds
    before: ClassMetrics
    after: ClassMetrics
    ece_before: float
    ece_after: float
    target_met: bool  # whether some threshold reaches the answer-precision target

    def to_dict(self) -> dict:
        return asdict(self)


def fit_temperature(logits: np.ndarray, labels: Sequence[int]) -> float:
    """The temperature in [0.05, 20] minimising the NLL (golden-section search in log T)."""
    y = np.asarray(labels)

    def nll(log_t: float) -> float:
        p = softmax(logits / np.exp(log_t))
        return float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-12, None)).mean())

    lo, hi = np.log(0.05), np.log(20.0)
    ratio = (np.sqrt(5) - 1) / 2
    for _ in range(80):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if nll(a) < nll(b):
            hi = b
        else:
            lo = a
    return float(np.exp((lo + hi) / 2))


def decisions(probs: np.ndarray, thresholds: Thresholds) -> list[int]:
    """Decisions as label indices, as the metrics take them."""
    return [LABELS.index(d) for d in decide_all(probs.tolist(), thresholds)]


def choose_thresholds(probs: np.ndarray, labels: Sequence[int], answer_precision: float) -> tuple[Thresholds, bool]:
    """(thresholds, whether the answer-precision target was reachable); see the module docstring."""
    y = np.asarray(labels)
    candidates = np.unique(np.concatenate([[0.0, 1.0], probs[:, 1]]))
    meeting = [t for t in sorted(set(probs[:, 0].tolist()))
               if (y[probs[:, 0] >= t] == 0).mean() >= answer_precision]  # t is a probability: never empty
    scored = []  # (macro-F1, t_answer, t_refuse) per answer threshold, its best refuse threshold
    for t in meeting or [1.0]:  # unreachable: answer nothing below certainty
        f1 = refuse_threshold_f1(probs, y, t, candidates)
        i = int(np.argmax(f1))
        scored.append((float(f1[i]), float(t), float(candidates[i])))
    _, t_answer, t_refuse = max(scored, key=lambda s: s[0])  # the first best: the lowest answer threshold
    return Thresholds(answer=t_answer, refuse=t_refuse), bool(meeting)


def refuse_threshold_f1(probs: np.ndarray, y: np.ndarray, t_answer: float, candidates: np.ndarray) -> np.ndarray:
    """Macro-F1 of the policy at `t_answer` for every refuse threshold in `candidates`, in one pass.

    Rows under the answer threshold are refused when p(refuse) >= t, else sent to search, so each
    class's true and predicted counts are counts of p(refuse) values at or above t (sorted + searchsorted).
    """
    answered = probs[:, 0] >= t_answer
    rest_p, rest_y = probs[~answered, 1], y[~answered]

    def at_or_above(values: np.ndarray) -> np.ndarray:
        return len(values) - np.searchsorted(np.sort(values), candidates, side="left")

    actual = np.array([(y == c).sum() for c in range(3)], dtype=float)
    refused = at_or_above(rest_p)
    tp = [np.full(len(candidates), float((y[answered] == 0).sum())),
          at_or_above(rest_p[rest_y == 1]).astype(float),
          float((rest_y == 2).sum()) - at_or_above(rest_p[rest_y == 2])]
    predicted = [np.full(len(candidates), float(answered.sum())), refused.astype(float), len(rest_p) - refused]
    f1 = [np.divide(2 * tp[c], predicted[c] + actual[c], out=np.zeros(len(candidates)),
                    where=(predicted[c] + actual[c]) > 0) for c in range(3)]
    return np.mean(f1, axis=0)


def calibrate(model_dir: str | Path, adapter_dir: str | Path, val: Sequence[Example],
              answer_precision: float = 0.95, max_context: int | None = None) -> CalibrationReport:
    """Calibrate the adapter in place on `val` (see the module docstring) and report before/after."""
    from safetensors.torch import load_file, save_file

    from gatehead.gate.reference import HFReference

    if not 0.0 < answer_precision <= 1.0:
        raise ValueError(f"answer_precision must be in (0, 1], got {answer_precision}")
    adapter_dir = Path(adapter_dir)
    reference = HFReference(model_dir, adapter_dir, dtype="float32")
    adapter = reference.adapter
    assert adapter is not None
    window = max_context or min(int(reference.gate_model.config.max_position_embeddings), 4096)
    builder = PromptBuilder(reference.tokenizer, adapter.spec.suffix, PromptConfig(max_context=window, answer_tokens=1))
    prompts = gate_prompts(val, builder)
    labels = [LABELS.index(e.label) for e in val]
    order = [adapter.spec.labels.index(label) for label in LABELS]
    logits = reference.gate_logits(prompts).astype(np.float64)[:, order]
    temperature = fit_temperature(logits, labels)
    before_probs, after_probs = softmax(logits), softmax(logits / temperature)
    thresholds, met = choose_thresholds(after_probs, labels, answer_precision)
    report = CalibrationReport(
        temperature=temperature,
        thresholds_before=adapter.spec.thresholds,
        thresholds_after=thresholds,
        before=classification_metrics(labels, decisions(before_probs, adapter.spec.thresholds)),
        after=classification_metrics(labels, decisions(after_probs, thresholds)),
        ece_before=expected_calibration_error(labels, before_probs),
        ece_after=expected_calibration_error(labels, after_probs),
        target_met=met,
    )
    with replace_dir(adapter_dir, start_from=adapter_dir) as tmp:
        tensors = load_file(tmp / ADAPTER_WEIGHTS)
        head = next(k for k in tensors if k.endswith("score.weight"))
        tensors[head] = (tensors[head].double() / temperature).to(tensors[head].dtype)
        save_file(tensors, tmp / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        spec = json.loads((tmp / GATE_JSON).read_text())
        spec["thresholds"] = thresholds.to_dict()
        (tmp / GATE_JSON).write_text(json.dumps(spec, indent=2) + "\n")
        (tmp / "calibration.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        load_gate_adapter(tmp, model_dir)
    return report
