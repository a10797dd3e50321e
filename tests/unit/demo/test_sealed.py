"""Sealed data, one door: a reading of a test split is recorded with the weights it measured; the suite reads none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatehead.demo import sealed
from gatehead.demo.build import train_gate_and_report
from gatehead.demo.evaluate import evaluation_sets
from gatehead.demo.splits import DATA_DIR, held_out_examples
from gatehead.digest import fingerprint


@pytest.fixture
def weights(tmp_path: Path) -> tuple[Path, Path]:
    model, adapter = tmp_path / "model", tmp_path / "adapter"
    for folder, data in ((model, b"model"), (adapter, b"adapter")):
        folder.mkdir()
        (folder / "weights.safetensors").write_bytes(data)
    return model, adapter


def test_the_suite_runs_sealed() -> None:
    import os

    assert os.environ.get(sealed.CLOSED) == "closed"  # set by tests/conftest.py, for every process it starts


def test_a_reading_is_recorded_with_the_weights_it_measured(weights, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(sealed.CLOSED)
    model, adapter = weights
    ledger = tmp_path / "ledger.jsonl"
    test_file = DATA_DIR / "test.jsonl"
    assert sealed.unseal(test_file, model, adapter, ledger) == test_file
    (line,) = [json.loads(x) for x in ledger.read_text().splitlines()]
    assert line["kind"] == "sealed-read" and line["file"] == "demo/data/test.jsonl"
    assert line["fingerprints"] == {"model": fingerprint(model), "adapter": fingerprint(adapter)}
    assert line["file_sha256"] and line["commit"] and line["command"]
    assert sealed.readings({"model": fingerprint(model), "adapter": fingerprint(adapter)}, ledger) == [line]
    assert sealed.readings({"model": fingerprint(model)}, ledger) == []  # another gate (none) on the same model
    # Validation and a user's own file are no test split: read unrecorded.
    assert sealed.unseal(DATA_DIR / "val.jsonl", model, adapter, ledger) == DATA_DIR / "val.jsonl"
    assert sealed.unseal(tmp_path / "mine.jsonl", model, None, ledger) == tmp_path / "mine.jsonl"
    assert len(ledger.read_text().splitlines()) == 1


def test_every_test_split_is_guarded(weights) -> None:
    demo = DATA_DIR.parent
    for path in (DATA_DIR / "test.jsonl", DATA_DIR / "phrased-test.jsonl", DATA_DIR / "handwritten-test.jsonl",
                 demo / "handwritten.jsonl", demo / "threads-handwritten.jsonl"):
        assert sealed.is_sealed(path), path
        with pytest.raises(sealed.SealedError, match="sealed test split"):
            sealed.unseal(path, *weights)
    assert not sealed.is_sealed(DATA_DIR / "val.jsonl") and not sealed.is_sealed(DATA_DIR / "train.jsonl")


def test_the_readers_of_test_go_through_the_door(weights) -> None:
    with pytest.raises(ValueError, match="no test split"):
        held_out_examples(("val", "test"))
    assert {e.where.split(":")[0] for e in held_out_examples()} == {"val"}
    with pytest.raises(ValueError, match="read only to measure a model"):
        evaluation_sets(DATA_DIR, "test")
    with pytest.raises(sealed.SealedError):
        evaluation_sets(DATA_DIR, "test", weights)
    import inspect

    # The gate's training reads test only when told (`--test`), and then through the door once trained.
    assert inspect.signature(train_gate_and_report).parameters["read_test"].default is False
