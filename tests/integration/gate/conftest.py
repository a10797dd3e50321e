"""A learnable labelled gate set: the label follows from the documents, as a gate should learn it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

PRODUCTS = ["router", "battery", "laptop", "printer", "phone", "tablet"]


def labelled_rows(n: int, seed: int) -> list[dict]:
    """answer: a document on the asked product; search: documents on other products; refuse: none."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        product = rng.choice(PRODUCTS)
        label = ("answer", "search", "refuse")[i % 3]
        if label == "answer":
            docs = [f"The {product} warranty lasts {rng.randint(1, 5)} years."]
        elif label == "search":
            other = rng.choice([p for p in PRODUCTS if p != product])
            docs = [f"The {other} warranty lasts {rng.randint(1, 5)} years."]
        else:
            docs = []
        rows.append({"question": f"How long is the {product} warranty?", "documents": docs, "label": label})
    return rows


@pytest.fixture(scope="session")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """train (150), val (60) and test (60) JSONL files."""
    root = tmp_path_factory.mktemp("labelled")
    files = {}
    for name, n, seed in (("train", 150, 0), ("val", 60, 1), ("test", 60, 2)):
        files[name] = root / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in labelled_rows(n, seed)))
    return files
