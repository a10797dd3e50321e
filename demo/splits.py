"""The demo's labelled splits as files: where they are, how they are read and written, and what trains.

What the build pipeline, the benchmarks and the tests read of the demo's data, apart from the pipeline
itself (`gatehead.demo.build`): validation examples for engine checks and benchmarks (no test split:
`gatehead.demo.sealed`), the training rows, the hand-typed texts kept out of training, the JSONL helpers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gatehead.demo import DEMO_DIR

DATA_DIR = DEMO_DIR / "data"
HANDWRITTEN = DEMO_DIR / "handwritten.jsonl"  # typed by hand; labelled, never generated


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def held_out_examples(splits: Sequence[str] = ("val",)) -> list:
    """Labelled questions with their retrieved documents, as gate `Example`s: inputs for engine checks and
    benchmarks, which read no test split (a model is measured on test by `evaluate --split test`)."""
    from gatehead.gate.data import parse_example

    if "test" in splits:
        raise ValueError("held_out_examples gives no test split: measure on test with "
                         "`python -m gatehead.demo.build evaluate --split test`")
    return [parse_example(row, f"{split}:{i}") for split in splits
            for i, row in enumerate(read_jsonl(DATA_DIR / f"{split}.jsonl"), 1)]


def handwritten_texts() -> frozenset[str]:
    """The questions and thread messages typed by hand (`demo/handwritten.jsonl`,
    `demo/threads-handwritten.jsonl`): test sets, never trained on or chosen by."""
    from gatehead.demo.threads import THREADS

    messages = [turn["message"] for row in read_jsonl(THREADS) for turn in row["turns"]]
    return frozenset([row["question"] for row in read_jsonl(HANDWRITTEN)] + messages)


def training_records(data_dir: Path, phrasings: bool, split: str = "train") -> list[dict]:
    """The labelled rows of `split` that train (or, for "val", choose): the templated ones, and with
    `phrasings` the phrased ones (`phrased-<split>.jsonl`) after them. A row whose question is one of
    the hand-typed test questions is left out (a few typed messages equal listed out-of-scope ones)."""
    rows = read_jsonl(data_dir / f"{split}.jsonl")
    rows += read_jsonl(data_dir / f"phrased-{split}.jsonl") if phrasings else []
    held_out = handwritten_texts()
    return [row for row in rows if row["question"] not in held_out]
