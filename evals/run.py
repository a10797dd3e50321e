"""Running an eval: its output folder (JSON result, Markdown report, PNG plots) and the ledger.

The ledger is an append-only JSONL file: one line per run, written when the run ends, whatever its
verdict ("pass", "fail", or "error" when the run itself broke). Lines are only ever appended
(O_APPEND, flushed and fsynced), so a failure can never be overwritten by a later pass.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gatehead import provenance
from gatehead.provenance import append_to_ledger

DEFAULT_ROOT = Path("eval-runs")  # <root>/<eval>-<time>/ per run, <root>/ledger.jsonl
LEDGER_FILE = "ledger.jsonl"


@dataclass
class Outcome:
    """What an eval found: its verdict, the figures (JSON), the report (Markdown), plots written."""

    passed: bool
    result: dict[str, Any]
    report: str
    plots: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)  # the few figures the ledger line carries


def run_eval(name: str, settings: dict[str, Any], body: Callable[[Path], Outcome], out: Path | None = None,
             ledger: Path | None = None) -> int:
    """Run `body(out_dir)`, write its outputs, append the verdict to the ledger; 0 iff it passed.

    A body that raises is recorded as "error" (with the traceback in the output folder) and re-raised.
    """
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(out) if out is not None else DEFAULT_ROOT / f"{name}-{stamp}"
    ledger = Path(ledger) if ledger is not None else DEFAULT_ROOT / LEDGER_FILE
    out.mkdir(parents=True, exist_ok=True)
    for name_ in ("result.json", "report.md"):  # a resumed run keeps the earlier run's outputs beside its own
        if (out / name_).exists():
            (out / name_).rename(out / f"{Path(name_).stem}-before-{stamp}{Path(name_).suffix}")
    entry: dict[str, Any] = {"id": uuid.uuid4().hex, "eval": name, "started": stamp, "out": str(out),
                             "command": " ".join(sys.argv), "settings": settings, "machine": provenance.machine(),
                             "versions": provenance.versions(), "commit": provenance.described_commit()}
    started = time.perf_counter()
    try:
        outcome = body(out)
    except BaseException as exc:
        (out / "error.txt").write_text(traceback.format_exc(), encoding="utf-8")
        append_to_ledger(ledger, {**entry, "seconds": round(time.perf_counter() - started, 1), "verdict": "error",
                                  "error": f"{type(exc).__name__}: {exc}"})
        raise
    seconds = round(time.perf_counter() - started, 1)
    verdict = "pass" if outcome.passed else "fail"
    try:  # the verdict reaches the ledger even if writing the reports fails
        result = {"eval": name, "verdict": verdict, "seconds": seconds, "commit": entry["commit"], "settings": settings,
                  "machine": entry["machine"], "versions": entry["versions"], **outcome.result}
        (out / "result.json").write_text(json.dumps(result, indent=2, ensure_ascii=False, default=str) + "\n",
                                         encoding="utf-8")
        header = (f"# gatehead eval {name}: {verdict.upper()}\n\n"
                  f"Run {stamp}, {seconds} s on {entry['machine']['host']} ({entry['machine']['cpus']} CPUs"
                  f"{', ' + entry['machine']['gpu'] if 'gpu' in entry['machine'] else ''}); "
                  f"command: `{entry['command']}`. Rule: `evals/RULES.md`.\n\n")
        plots = "".join(f"\n![{Path(p).stem}]({Path(p).name})\n" for p in outcome.plots)
        (out / "report.md").write_text(header + outcome.report.strip() + "\n" + plots, encoding="utf-8")
    finally:
        append_to_ledger(ledger, {**entry, "seconds": seconds, "verdict": verdict, "summary": outcome.summary})
    print(f"gatehead eval {name}: {verdict} ({seconds} s) -> {out}/report.md; ledger {ledger}", file=sys.stderr)
    return 0 if outcome.passed else 1


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table; floats to 4 significant digits."""
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
