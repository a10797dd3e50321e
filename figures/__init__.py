"""`gatehead figures`: re-measure the figures the pages report, each into an envelope of its own.

Every item (`figures.items`) is one command of this repository (an eval, a benchmark, the demo kit's
evaluation, a test file that records its figures) run as a subprocess with a time limit (`figures.runner`).
A finished item writes `docs/figures/<item>.json`: the command, the commit (and whether the tree had
uncommitted changes: it measures a clean tree unless told otherwise), the date, how long it took, the
machine, the fingerprints of the model and adapter it measured, and the command's own results. A failed or
timed-out item leaves its previous file alone and makes the run exit 1. The evals append their verdicts to
the demo's append-only ledger, `evals/demo-ledger.jsonl`.

Sealed data: the demo's test split (with its hand-written questions) is read once per committed model
(`demo-test`, `eval-dataset-test`, ...): an item of that kind refuses to run again while its file or the
ledger holds a reading of the model and adapter committed now, unless `reread` says the reading is
deliberate (the file then records `reread: true`).

The pages' figure blocks render these envelopes (`figures.pages`, `figures.views`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gatehead.digest import fingerprint
from gatehead.figures.items import FIGURES_DIR, ITEMS, LEDGER, ROOT, Item, by_name, wrong_host
from gatehead.figures.pages import (
    BLOCK,
    PAGES,
    load_envelope,
    readme_problems,
    render_block,
    rewrite_readme,
    unrendered,
)
from gatehead.figures.runner import fingerprints, run_item, sealed_read, shown, stop_on_signals
from gatehead.figures.views import VIEWS

__all__ = ["BLOCK", "FIGURES_DIR", "ITEMS", "LEDGER", "PAGES", "ROOT", "VIEWS", "FiguresConfig", "Item", "by_name",
           "fingerprint", "fingerprints", "load_envelope", "main", "readme_problems", "render_block",
           "rewrite_readme", "run_item", "sealed_read", "shown", "unrendered", "wrong_host"]


@dataclass(frozen=True)
class FiguresConfig:
    """One `gatehead figures` run: which items, or only listing them, or only re-rendering the pages."""

    only: tuple[str, ...] = ()  # these items (default: every item this machine can run)
    list_only: bool = False
    readme: bool = False  # re-render the pages' blocks from their envelopes; measure nothing
    reread: bool = False  # read sealed held-out data again on the same weights (a development figure)
    allow_dirty: bool = False  # measure a tree with uncommitted changes (recorded; the pages then say so)
    dir: Path = Path("docs/figures")
    logs: Path | None = None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _render_pages() -> int:
    missing: list[str] = []
    for page in PAGES:
        changed = rewrite_readme(ROOT / page, missing=missing)
        print(f"{page}: {changed} figure block(s) re-rendered", file=sys.stderr)
    for source in dict.fromkeys(missing):
        print(f"  not rendered, no results file: {source} (gatehead figures writes it)", file=sys.stderr)
    loose = unrendered()
    for path in loose:
        print(f"  {path}: no page renders or names it (add a figure block, or remove it)", file=sys.stderr)
    return 1 if missing or loose else 0


def main(config: FiguresConfig) -> int:
    if config.readme:
        return _render_pages()
    items = by_name(config.only) if config.only else list(ITEMS)
    if not config.only and not config.list_only and not _has_cuda():
        for item in [i for i in items if i.cuda]:
            print(f"{item.name}: left out, it needs a CUDA GPU (--only {item.name} on one)", file=sys.stderr)
        items = [i for i in items if not i.cuda]
    if not config.only and not config.list_only:
        why = {item.name: wrong_host(item) for item in items}
        for name in filter(why.get, why):
            print(f"{name}: left out: {why[name]}", file=sys.stderr)
        items = [i for i in items if not why[i.name]]
    if config.list_only:
        for item in items:
            state = "  [sealed, read on this model]" if item.sealed and sealed_read(item, config.dir) else ""
            print(f"{item.name:28} ~{item.minutes:>4.0f} min  {item.about}{state}")
            print(f"{'':28} {shown(item)}")
        return 0
    stop_on_signals()
    total = sum(i.minutes for i in items)
    print(f"{len(items)} item(s), about {total:.0f} min on a 2-core CPU; results in {config.dir}", file=sys.stderr)
    failed = []
    for n, item in enumerate(items, 1):
        print(f"[{n}/{len(items)}] {item.name}: {item.about} (~{item.minutes:.0f} min)", file=sys.stderr)
        try:
            envelope = run_item(item, config.dir, reread=config.reread, log_dir=config.logs,
                                allow_dirty=config.allow_dirty)
            print(f"  wrote {config.dir / (item.name + '.json')} in {envelope['seconds'] / 60:.1f} min",
                  file=sys.stderr)
        except RuntimeError as exc:
            failed.append(item.name)
            print(f"  FAILED: {exc}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} of {len(items)} failed, their earlier files kept: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
