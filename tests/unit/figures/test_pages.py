"""The pages' figure tables are rendered from committed `gatehead figures` envelopes of the committed model,
measured on committed code, and every results file in the tree is rendered or named by a page."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gatehead import figures
from gatehead.figures import BLOCK, fingerprints, readme_problems, render_block, unrendered

SOURCE = "docs/figures/bench-demo.json"


def test_every_pages_figure_blocks_match_their_envelopes() -> None:
    texts = {page: (figures.ROOT / page).read_text() for page in figures.PAGES}
    sources = {one for text in texts.values() for m in BLOCK.finditer(text) for one in m["source"].split(",")}
    assert {f"docs/figures/{name}.json" for name in ("bench-demo", "fidelity", "soak", "demo-test", "eval-dataset-test",
                                                    "gpu-branch")} <= sources
    for page, text in texts.items():
        assert readme_problems(text) == [], page
        # A block shows the command as a person types it, never a run's temporary files.
        assert not [m["source"] for m in BLOCK.finditer(text) if "/tmp/" in m["body"]], page


def test_every_results_file_is_rendered_or_named_by_a_page() -> None:
    assert unrendered() == []


def test_every_item_has_a_block_that_says_when_it_is_not_measured(tmp_path: Path) -> None:
    """Each item's envelope has a place on a page before it exists: the block says it is not yet measured and
    what measures it, so a new figure lands in a table, never loose."""
    texts = [(figures.ROOT / page).read_text() for page in figures.PAGES]
    sources = {one for text in texts for m in BLOCK.finditer(text) for one in m["source"].split(",")}
    assert {f"docs/figures/{item.name}.json" for item in figures.ITEMS} <= sources
    assert render_block("docs/figures/demo-val.json", "demo-sets", tmp_path) == (
        "*Not yet measured on the committed model: `gatehead figures --only demo-val`.*\n")
    # Part of a block measured: those figures are shown, in views of a row per envelope, and the rest named.
    verdict = _repo(tmp_path, "eval-kv")["results"]["verdict"]  # the committed figure's, whichever it is
    both = "docs/figures/eval-kv.json,docs/figures/eval-dataset-val.json"
    text = render_block(both, "evals", tmp_path)
    assert text.startswith("| item | verdict |") and f"| eval-kv | {verdict} |" in text
    assert text.endswith("\n*Not yet measured on the committed model: `gatehead figures --only eval-dataset-val`.*\n")
    assert render_block(f"{SOURCE},docs/figures/eval-kv.json", "bench", tmp_path).startswith("*Not yet measured")
    unknown = "<!-- figures docs/figures/no-such-item.json bench -->\n<!-- /figures -->"
    assert readme_problems(unknown, tmp_path) == [
        "docs/figures/no-such-item.json: missing, and no `gatehead figures` item writes it"]


def _repo(root: Path, name: str = "bench-demo") -> dict:
    """A repository holding the committed demo adapters and an envelope of item `name` of them (the committed
    one's results); returns the envelope."""
    item = figures.by_name([name])[0]
    for _, rel in item.fingerprints:
        if not (root / rel).exists():
            shutil.copytree(figures.ROOT / rel, root / rel)
    source = f"docs/figures/{name}.json"
    results = json.loads((figures.ROOT / source).read_text())["results"]
    envelope = {"item": item.name, "command": figures.shown(item),
                "commit": "0123456789abcdef", "dirty": False, "date": "2026-12-06T00:00:00Z",
                "machine": {"cpus": 2, "bf16": "emulated"}, "fingerprints": fingerprints(item, root),
                "results": results}
    (root / "docs/figures").mkdir(parents=True, exist_ok=True)
    (root / source).write_text(json.dumps(envelope))
    return envelope


def _block(source: str, view: str, root: Path) -> str:
    return f"<!-- figures {source} {view} -->\n{render_block(source, view, root)}<!-- /figures -->"


def test_a_stale_table_a_missing_file_a_raw_file_and_another_model_are_caught(tmp_path: Path) -> None:
    envelope = _repo(tmp_path)
    block = _block(SOURCE, "bench", tmp_path)
    assert readme_problems(block, tmp_path) == []
    envelope["results"]["ratios"]["single_c1_throughput_a_suffix_over_b"]["median"] += 0.5
    (tmp_path / SOURCE).write_text(json.dumps(envelope))
    assert readme_problems(block, tmp_path) == [f"{SOURCE} (bench): the page's table differs from the file's figures"]
    assert readme_problems(block.replace(SOURCE, "docs/figures/gone.json"), tmp_path) == [
        "docs/figures/gone.json: missing, and no `gatehead figures` item writes it"]
    raw = "docs/figures/raw.json"  # a benchmark's own results file: no commit, no fingerprints
    (tmp_path / raw).write_text(json.dumps(envelope["results"]))
    [problem] = readme_problems(block.replace(SOURCE, raw), tmp_path)
    assert problem.startswith(f"{raw}: not a `gatehead figures` envelope")
    # Another adapter committed: the old table is flagged, and the re-rendered block names what re-measures it.
    block = _block(SOURCE, "bench", tmp_path)
    (tmp_path / "demo/adapter/adapter_model.safetensors").write_bytes(b"another adapter")
    assert readme_problems(block, tmp_path) == [f"{SOURCE} (bench): the page's table differs from the file's figures"]
    assert render_block(SOURCE, "bench", tmp_path) == (
        "*Not yet measured on the committed model (the figures on file were measured on an earlier model or "
        "adapter): `gatehead figures --only bench-demo`.*\n")
    assert readme_problems(_block(SOURCE, "bench", tmp_path), tmp_path) == []


def test_a_figure_measured_with_uncommitted_changes_says_so_and_fails_the_check(tmp_path: Path) -> None:
    envelope = _repo(tmp_path)
    clean = render_block(SOURCE, "bench", tmp_path)
    (tmp_path / SOURCE).write_text(json.dumps({**envelope, "dirty": True}))
    body = render_block(SOURCE, "bench", tmp_path)
    assert body.startswith(clean) and body.endswith(
        "*Measured with uncommitted changes (bench-demo at 0123456): not a committed figure.*\n")
    assert readme_problems(_block(SOURCE, "bench", tmp_path), tmp_path) == [
        f"{SOURCE}: measured with uncommitted changes (commit 0123456)"]


def test_a_second_reading_of_test_data_is_called_a_development_figure(tmp_path: Path) -> None:
    envelope = _repo(tmp_path)
    clean = render_block(SOURCE, "bench", tmp_path)
    (tmp_path / SOURCE).write_text(json.dumps({**envelope, "reread": True}))
    body = render_block(SOURCE, "bench", tmp_path)
    assert body.startswith(clean) and "*Development figure (bench-demo): these weights had been measured" in body


def test_unrendered_results_files_are_found(tmp_path: Path) -> None:
    _repo(tmp_path)
    (tmp_path / "docs/history/results/old").mkdir(parents=True)
    (tmp_path / "docs/history/results/old/a.json").write_text("{}")
    (tmp_path / "docs/history/results/b.json").write_text("{}")
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/c.json").write_text("{}")
    (tmp_path / "README.md").write_text(_block(SOURCE, "bench", tmp_path) + "\n")
    (tmp_path / "docs/history.md").write_text("The old runs: `docs/history/results/old/`.\n")
    assert unrendered(tmp_path, ("README.md",)) == ["docs/history/results/b.json", "benchmarks/results/c.json"]
    (tmp_path / "README.md").write_text("no block\n")
    assert unrendered(tmp_path, ("README.md",)) == [SOURCE, "docs/history/results/b.json", "benchmarks/results/c.json"]
