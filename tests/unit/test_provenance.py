"""The ledger: the committed one reads whole, and a mangled line is an error naming it, never a skipped line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gatehead.provenance import ROOT, append_to_ledger, read_ledger


def test_the_committed_ledger_reads_line_by_line() -> None:
    ledger = ROOT / "evals" / "demo-ledger.jsonl"
    lines = [line for line in ledger.read_text(encoding="utf-8").splitlines() if line.strip()]
    entries = read_ledger(ledger)
    assert len(entries) == len(lines) > 0
    assert any(e.get("kind") == "sealed-read" for e in entries)  # the sealed-data rule has readings to judge


def test_a_mangled_line_is_an_error_naming_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    append_to_ledger(ledger, {"eval": "kv", "verdict": "pass"})
    assert read_ledger(ledger) == [{"eval": "kv", "verdict": "pass"}]
    with ledger.open("a") as f:  # a line pasted from a diff, its "+" kept
        f.write('+{"kind": "sealed-read"}\n')
    with pytest.raises(ValueError, match=r"ledger\.jsonl:2 is not a JSON line"):
        read_ledger(ledger)
    ledger.write_text('{"eval": "kv"}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"ledger\.jsonl:2 is not a JSON object"):
        read_ledger(ledger)
    assert read_ledger(tmp_path / "none.jsonl") == []
