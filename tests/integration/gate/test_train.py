"""Gate training and calibration end to end on the tiny model, on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gatehead.gate.adapter import load_gate_adapter
from gatehead.gate.calibrate import calibrate, choose_thresholds, decisions, fit_temperature
from gatehead.gate.data import read_examples
from gatehead.gate.metrics import classification_metrics, softmax
from gatehead.gate.policy import Thresholds
from gatehead.gate.train import TrainConfig, train_gate
from gatehead.tiny import TinyModel

GATEHEAD = str(Path(sys.executable).parent / "gatehead")


@pytest.fixture(scope="module")
def data(labelled) -> dict[str, Path]:
    return labelled


@pytest.fixture(scope="module")
def trained(tiny: TinyModel, data, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("trained") / "adapter"
    config = TrainConfig(epochs=8, learning_rate=2e-3, patience=3, progress=False)
    return train_gate(tiny.model_dir, read_examples(data["train"]), read_examples(data["val"]), out, config)


def test_training_learns_the_labels(trained, tiny: TinyModel, data) -> None:
    from gatehead.gate.reference import HFReference

    untrained, best = trained.epochs[0], trained.epochs[trained.best_epoch]
    assert untrained.train_loss is None and trained.best_epoch >= 1
    assert best.val_loss < untrained.val_loss and best.val.accuracy > max(untrained.val.accuracy, 0.6)
    assert best.val_loss == min(e.val_loss for e in trained.epochs[1:])
    assert set(best.val.recall) == {"answer", "refuse", "search"}
    assert json.loads((trained.adapter.path / "training.json").read_text())["best_epoch"] == trained.best_epoch
    # Held-out data, through the HF reference: better than the random adapter it started from.
    test = read_examples(data["test"])[:30]

    def accuracy(adapter_dir) -> float:
        reference = HFReference(tiny.model_dir, adapter_dir)
        probs = [reference.gate(e.question, e.passages).probs for e in test]
        return float(np.mean([max(p, key=p.get) == e.label for p, e in zip(probs, test, strict=True)]))

    assert accuracy(trained.adapter.path) > max(accuracy(tiny.adapter_dir), 0.6)


def test_trained_adapter_is_in_the_real_format(trained, tiny: TinyModel) -> None:
    adapter = load_gate_adapter(trained.adapter.path, tiny.model_dir)
    assert adapter.layers == (2, 3, 4, 5) and adapter.spec.k == 4


def test_training_is_reproducible(tiny: TinyModel, data, tmp_path: Path) -> None:
    train, val = read_examples(data["train"])[:24], read_examples(data["val"])[:12]
    config = TrainConfig(epochs=2, progress=False, seed=3)
    a = train_gate(tiny.model_dir, train, val, tmp_path / "a", config)
    b = train_gate(tiny.model_dir, train, val, tmp_path / "b", config)
    weights = "adapter_model.safetensors"
    assert (a.adapter.path / weights).read_bytes() == (b.adapter.path / weights).read_bytes()


def test_bad_input_writes_nothing(tiny: TinyModel, data, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(data["train"].read_text().splitlines()[0] + "\n" + '{"question": "q", "documents": []}\n')
    out = tmp_path / "never"
    result = subprocess.run([GATEHEAD, "train-gate", "--model", str(tiny.model_dir), "--train", str(bad),
                             "--val", str(data["val"]), "--out", str(out)], capture_output=True, text=True)
    assert result.returncode == 2 and "bad.jsonl:2: missing field 'label'" in result.stderr
    assert not out.exists()


def test_temperature_and_thresholds_on_known_probabilities() -> None:
    rng = np.random.default_rng(0)
    true_logits = rng.normal(size=(4000, 3)) * 2.0
    true_probs = softmax(true_logits)  # calibrated by construction: labels are drawn from them
    labels = np.array([rng.choice(3, p=p) for p in true_probs])
    assert fit_temperature(true_logits * 3.0, labels) == pytest.approx(3.0, rel=0.15)  # overconfident by 3x
    probs = softmax(true_logits)
    thresholds, met = choose_thresholds(probs, labels.tolist(), answer_precision=0.9)
    answered = probs[:, 0] >= thresholds.answer
    assert met and (labels[answered] == 0).mean() >= 0.9

    def macro_f1(t: Thresholds) -> float:
        return float(np.mean(list(classification_metrics(labels.tolist(), decisions(probs, t)).f1.values())))

    # The best macro-F1 of every pair that meets the target; a brute-force scan over a grid agrees.
    chosen = macro_f1(thresholds)
    grid = [Thresholds(answer=float(a), refuse=float(r)) for a in np.linspace(0, 1, 41) for r in np.linspace(0, 1, 41)]
    meeting = [t for t in grid if (probs[:, 0] >= t.answer).any()
               and (labels[probs[:, 0] >= t.answer] == 0).mean() >= 0.9]
    assert meeting and chosen >= max(map(macro_f1, meeting)) - 1e-12
    # Not simply the lowest answer threshold that meets the target: at a loose target (0.4) that one
    # answers nearly everything and scores lower.
    loose, _ = choose_thresholds(probs, labels.tolist(), answer_precision=0.4)
    lowest = min(float(t) for t in probs[:, 0] if (labels[probs[:, 0] >= t] == 0).mean() >= 0.4)
    assert loose.answer > lowest and macro_f1(loose) > max(macro_f1(Thresholds(answer=lowest, refuse=float(r)))
                                                          for r in np.linspace(0, 1, 101))
    # Precision 1.0 is reachable here iff the most answer-confident row is an answer; then the answered rows are
    # all answers. Where it is not reachable (the top row relabelled refuse), nothing below certainty is answered.
    top = int(np.argmax(probs[:, 0]))
    assert labels[top] == 0
    strict, met = choose_thresholds(probs, labels.tolist(), answer_precision=1.0)
    assert met and (labels[probs[:, 0] >= strict.answer] == 0).all() and strict.answer <= probs[top, 0]
    relabelled = labels.copy()
    relabelled[top] = 1
    strict, met = choose_thresholds(probs, relabelled.tolist(), answer_precision=1.0)
    assert not met and strict.answer == 1.0 and not (probs[:, 0] >= strict.answer).any()


def test_refuse_threshold_scan_equals_the_policy_applied_at_each_threshold() -> None:
    from gatehead.gate.calibrate import decisions, refuse_threshold_f1
    from gatehead.gate.metrics import classification_metrics
    from gatehead.gate.policy import Thresholds

    rng = np.random.default_rng(1)
    probs = softmax(rng.normal(size=(300, 3)) * 2.0)
    labels = rng.integers(0, 3, 300)
    candidates = np.unique(np.concatenate([[0.0, 1.0], probs[:, 1]]))
    for t_answer in (0.0, 0.4, 1.0):
        scan = refuse_threshold_f1(probs, labels, t_answer, candidates)
        one_by_one = [np.mean(list(classification_metrics(labels.tolist(), decisions(
            probs, Thresholds(answer=t_answer, refuse=float(t)))).f1.values())) for t in candidates]
        assert np.abs(scan - np.array(one_by_one)).max() < 1e-12


def test_calibrate_rewrites_the_adapter_and_reports(trained, tiny: TinyModel, data, tmp_path: Path) -> None:
    import shutil

    adapter_dir = tmp_path / "adapter"
    shutil.copytree(trained.adapter.path, adapter_dir)
    report = calibrate(tiny.model_dir, adapter_dir, read_examples(data["val"]), answer_precision=0.8)
    adapter = load_gate_adapter(adapter_dir, tiny.model_dir)
    assert adapter.spec.thresholds == report.thresholds_after
    assert report.ece_after <= report.ece_before + 1e-9
    assert json.loads((adapter_dir / "calibration.json").read_text())["temperature"] == report.temperature
    result = subprocess.run([GATEHEAD, "calibrate", "--model", str(tiny.model_dir), "--adapter", str(adapter_dir),
                             "--val", str(data["val"]), "--answer-precision", "0.8"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    again = json.loads(result.stdout)
    assert again["temperature"] == pytest.approx(1.0, rel=0.02)  # already calibrated
    assert set(again["after"]["f1"]) == {"answer", "refuse", "search"}
