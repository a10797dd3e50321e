"""Sealed data, one door: every measurement of a model on a test split goes through `unseal` first.

The demo's test splits (the templated and phrased test questions, the hand-typed questions and threads) are
read once per committed model: its figures are then test figures; a second reading of the same weights makes
them development figures. Every command that measures a model on such a file passes it through `unseal`
first, which appends a line to the ledger (`evals/demo-ledger.jsonl`): what read it (the command line), the
file and its sha256, the fingerprints of the model and adapter measured, the commit and the time.
`readings` lists the earlier readings of a model and adapter from the ledger: `gatehead figures` refuses a
second one unless told `--reread`, and its rendered block then says "development figure".

Not a reading: checks of the data themselves (held out by entity and family, the threads' schema) and the
texts of the hand-typed sets kept out of training (`demo.splits.handwritten_texts`); no model meets a label.
The test suite reads no test split: it runs with `GATEHEAD_SEALED=closed`, under which `unseal` raises.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from gatehead.demo import DEMO_DIR
from gatehead.digest import fingerprint
from gatehead.provenance import append_to_ledger, described_commit, read_ledger

ROOT = DEMO_DIR.parent
LEDGER = ROOT / "evals" / "demo-ledger.jsonl"  # append-only: every verdict and every reading of a test split
CLOSED = "GATEHEAD_SEALED"  # "closed": this process may not read a test split (the test suite)
KIND = "sealed-read"


class SealedError(RuntimeError):
    """A test split read where no test split may be read."""


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def sealed_files() -> frozenset[Path]:
    """The demo's test splits: what `unseal` guards."""
    data = DEMO_DIR / "data"
    return frozenset(p.resolve() for p in (data / "test.jsonl", data / "phrased-test.jsonl",
                                           data / "handwritten-test.jsonl", DEMO_DIR / "handwritten.jsonl",
                                           DEMO_DIR / "threads-handwritten.jsonl"))


def is_sealed(path: Path) -> bool:
    return Path(path).resolve() in sealed_files()


def unseal(path: Path, model: Path, adapter: Path | None, ledger: Path | None = None) -> Path:
    """`path`, about to be read to measure `model` with the gate `adapter`: where it is a test split, once the
    reading (with their fingerprints, `weights_of`) is in `ledger` (default `LEDGER`). The one door: every
    measurement on a file that may be a test split passes it through here first."""
    path = Path(path)
    if not is_sealed(path):
        return path
    if os.environ.get(CLOSED) == "closed":
        raise SealedError(f"{_relative(path)} is a sealed test split and this process may not read it "
                          f"({CLOSED}=closed, as in the test suite): measure on the validation split")
    append_to_ledger(ledger or LEDGER, {
        "kind": KIND, "file": _relative(path), "file_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "fingerprints": weights_of(model, adapter), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": described_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return path


def weights_of(model: Path, adapter: Path | None) -> dict[str, str]:
    """The fingerprints a reading records: the model's and the gate adapter's (`gatehead.digest.fingerprint`)."""
    return {"model": fingerprint(Path(model)), **({"adapter": fingerprint(Path(adapter))} if adapter else {})}


def readings(fingerprints: Mapping[str, str], ledger: Path | None = None) -> list[dict]:
    """The ledger's readings of a test split that measured exactly these weights."""
    wanted = dict(fingerprints)
    return [e for e in read_ledger(ledger or LEDGER) if e.get("kind") == KIND and e.get("fingerprints") == wanted]
