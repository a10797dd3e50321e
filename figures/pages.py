"""The pages' figure blocks, rendered from `gatehead figures` envelopes.

A figure table on a page sits between `<!-- figures SOURCE VIEW -->` and `<!-- /figures -->`: SOURCE is
one envelope under `docs/figures/` (or several, comma-separated, for the views that compare), VIEW names the
renderer (`figures.views.VIEWS`). `gatehead figures --readme` rewrites every block from its envelopes; the
test suite renders them again and fails on any difference, on a source that is not an envelope, and on a
block measured with uncommitted changes. An envelope of an earlier model or adapter renders as one line
saying that it is not yet measured on the committed one, and what measures it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from gatehead.figures.items import ITEMS, ROOT, by_name
from gatehead.figures.runner import fingerprints
from gatehead.figures.views import VIEWS

PAGES = ("README.md", "docs/figures.md", "docs/demo-model.md")  # the pages whose figure blocks are rendered
BLOCK = re.compile(r"<!-- figures (?P<source>\S+) (?P<view>\S+) -->\n(?P<body>.*?)<!-- /figures -->", re.S)
LIVE = "docs/figures"  # the envelopes the pages render; every one is rendered by a block
ARCHIVE = "docs/history"  # earlier results, each named by a page that says what it was


class NotAnEnvelope(ValueError):
    """A block's source is not a `gatehead figures` envelope."""


def load_envelope(source: str, root: Path = ROOT) -> dict:
    data = json.loads((root / source).read_text())
    if not (isinstance(data, dict) and {"item", "fingerprints", "results", "commit", "dirty"} <= data.keys()):
        raise NotAnEnvelope(f"{source}: not a `gatehead figures` envelope (a block renders only what "
                            "`gatehead figures` measured, with its commit and fingerprints)")
    return data


def stale(envelope: dict, root: Path = ROOT) -> bool:
    """Whether an envelope was measured on other weights than the committed model and adapter (or on weights
    this checkout does not hold, such as a model built under `.cache/`)."""
    try:
        return envelope["fingerprints"] != fingerprints(by_name([envelope["item"]])[0], root)
    except FileNotFoundError:
        return True


# Views whose envelopes are rows or columns of their own: where some of a block's envelopes are measured on
# the committed model and others not yet, those are shown and the rest named. (A bench's parts make one table,
# shown only whole.)
PER_ENVELOPE = frozenset({"evals", "tests-tiny", "tests-demo", "gate-modes"})


def render_block(source: str, view: str, root: Path = ROOT) -> str:
    """A block's body: the view of its envelopes; where any of them is missing or was measured on an earlier
    model or adapter, one line saying so and what measures it (an old model's figures are never shown as the
    committed model's; the others are, in the views of one row or column per envelope); where any read sealed
    test data a second time, or was measured with uncommitted changes, a last line saying so."""
    if view not in VIEWS:
        raise ValueError(f"unknown figures view {view!r}; known: {sorted(VIEWS)}")
    sources = source.split(",")
    absent = [one for one in sources if not (root / one).exists()]
    envelopes = [load_envelope(one, root) for one in sources if one not in absent]
    old = {e["item"] for e in envelopes if stale(e, root)}
    pending_line = ""
    if absent or old:
        pending = [_measures(one) + (_SEALED if Path(one).stem in old and by_name([Path(one).stem])[0].sealed else "")
                   for one in sources if one in absent or Path(one).stem in old]
        why = " (the figures on file were measured on an earlier model or adapter)" if old else ""
        pending_line = f"*Not yet measured on the committed model{why}: {', '.join(dict.fromkeys(pending))}.*\n"
        envelopes = [e for e in envelopes if e["item"] not in old]
        if not envelopes or view not in PER_ENVELOPE:
            return pending_line
    body = VIEWS[view](envelopes) + ("\n" + pending_line if pending_line else "")
    again = [e["item"] for e in envelopes if e.get("reread")]
    if again:
        body += (f"\n*Development figure ({', '.join(again)}): these weights had been measured on this test split "
                 "before (`evals/demo-ledger.jsonl`), so it was not read once.*\n")
    dirty = [f"{e['item']} at {e['commit'][:7]}" for e in envelopes if e.get("dirty")]
    if dirty:
        body += f"\n*Measured with uncommitted changes ({', '.join(dirty)}): not a committed figure.*\n"
    return body


_SEALED = (" (sealed test data: refused where the committed weights have read it already; `--reread` then makes a "
           "development figure)")


def _an_item(source: str) -> bool:
    """Whether a `gatehead figures` item writes `source`."""
    return Path(source).parent.as_posix() == LIVE and Path(source).stem in {i.name for i in ITEMS}


def _measures(source: str) -> str:
    """What writes an envelope: `gatehead figures --only ITEM` for `docs/figures/ITEM.json`."""
    name = Path(source).stem
    if not _an_item(source):
        raise ValueError(f"{source}: no `gatehead figures` item writes it (blocks render `{LIVE}/<item>.json`)")
    return f"`gatehead figures --only {name}`"


def readme_problems(text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with a page's figure blocks: missing sources, sources that are not envelopes, figures
    measured with uncommitted changes, and bodies that are not their sources' rendering."""
    problems = []
    for match in BLOCK.finditer(text):
        source, view = match["source"], match["view"]
        missing = [s for s in source.split(",") if not (root / s).exists()]
        if missing:  # an item not yet measured: the block says so and names the command
            try:
                if render_block(source, view, root) != match["body"]:
                    problems.append(f"{source} ({view}): the page's block differs from its rendering")
            except ValueError:
                problems.extend(f"{s}: missing, and no `gatehead figures` item writes it" for s in missing)
            continue
        try:
            envelopes = [load_envelope(one, root) for one in source.split(",")]
        except NotAnEnvelope as exc:
            problems.append(str(exc))
            continue
        problems.extend(f"{one}: measured with uncommitted changes (commit {e['commit'][:7]})"
                        for one, e in zip(source.split(","), envelopes, strict=True)
                        if e.get("dirty") and not stale(e, root))
        if render_block(source, view, root) != match["body"]:
            problems.append(f"{source} ({view}): the page's table differs from the file's figures")
    return problems


def unrendered(root: Path = ROOT, pages: tuple[str, ...] = PAGES) -> list[str]:
    """Results files no page accounts for: an envelope under `docs/figures/` that no block renders, a file
    under `docs/history/` that no page names, and any file under a results folder outside those two."""
    texts = [(root / page).read_text() for page in pages]
    texts += [p.read_text() for p in sorted((root / "docs").glob("*.md")) if str(p.relative_to(root)) not in pages]
    sources = {one for text in texts for m in BLOCK.finditer(text) for one in m["source"].split(",")}
    found = [str(p.relative_to(root)) for p in sorted((root / LIVE).glob("*")) if p.is_file()
             and str(p.relative_to(root)) not in sources]
    named = {m.rstrip(".:;") for m in re.findall(rf"{ARCHIVE}/[^\s`'\"),\]]+", "\n".join(texts))}  # archive paths named
    for path in sorted((root / ARCHIVE).rglob("*")):
        folders = [f"{parent.relative_to(root)}/" for parent in path.parents if root / ARCHIVE in parent.parents]
        if path.is_file() and str(path.relative_to(root)) not in named and not named.intersection(folders):
            found.append(str(path.relative_to(root)))
    for folder in ("benchmarks/results", "evals/results"):
        found += [str(p.relative_to(root)) for p in sorted((root / folder).rglob("*")) if p.is_file()]
    return found


def rewrite_readme(path: Path, root: Path = ROOT, missing: list[str] | None = None) -> int:
    """Re-render every figure block of `path` (an item's envelope not yet measured renders as a line saying so;
    a source no item writes is named in `missing` and its block stays as it is); returns how many changed."""
    text, changed = path.read_text(), 0

    def fill(match: re.Match) -> str:
        nonlocal changed
        unknown = [s for s in match["source"].split(",") if not (root / s).exists() and not _an_item(s)]
        if unknown:  # no item writes it: the block stays as it is, and the caller hears of it
            if missing is not None:
                missing.extend(unknown)
            return match.group(0)
        body = render_block(match["source"], match["view"], root)
        changed += body != match["body"]
        return f"<!-- figures {match['source']} {match['view']} -->\n{body}<!-- /figures -->"

    path.write_text(BLOCK.sub(fill, text))
    return changed
