"""The README's figure tables are rendered from committed results files, and describe the committed model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gatehead import figures
from gatehead.figures import BLOCK, fingerprints, readme_problems, render_block

BENCH = "benchmarks/results/bench_random_cpu.json"


def test_every_pages_figure_blocks_match_their_results_files() -> None:
    texts = {page: (figures.ROOT / page).read_text() for page in figures.PAGES}
    sources = {one for text in texts.values() for m in BLOCK.finditer(text) for one in m["source"].split(",")}
    assert {BENCH, "docs/figures/bench-demo.json", "docs/figures/fidelity.json", "docs/figures/soak.json",
            "docs/figures/demo-test.json", "docs/figures/eval-dataset-test.json"} <= sources
    for page, text in texts.items():
        assert readme_problems(text) == [], page


def test_a_stale_table_a_missing_file_and_another_model_are_caught(tmp_path: Path) -> None:
    root = tmp_path
    (root / "benchmarks/results").mkdir(parents=True)
    shutil.copy(figures.ROOT / BENCH, root / BENCH)
    block = f"<!-- figures {BENCH} bench -->\n{render_block(BENCH, 'bench', root)}<!-- /figures -->"
    assert readme_problems(block, root) == []
    data = json.loads((root / BENCH).read_text())
    data["ratios"]["single_c1_throughput_a_suffix_over_b"]["median"] += 0.5
    (root / BENCH).write_text(json.dumps(data))
    assert readme_problems(block, root) == [f"{BENCH} (bench): the README's table differs from the file's figures"]
    assert readme_problems(block.replace(BENCH, "benchmarks/results/gone.json"), root) == [
        "benchmarks/results/gone.json: missing"]
    # An envelope from `gatehead figures`: its fingerprints must be the committed model's.
    item = figures.by_name(["bench-demo"])[0]
    for _, rel in item.fingerprints:
        shutil.copytree(figures.ROOT / rel, root / rel)
    envelope = {"item": item.name, "fingerprints": fingerprints(item, root), "results": data}
    (root / "docs/figures").mkdir(parents=True)
    (root / "docs/figures/bench-demo.json").write_text(json.dumps(envelope))
    source = "docs/figures/bench-demo.json"
    block = f"<!-- figures {source} bench -->\n{render_block(source, 'bench', root)}<!-- /figures -->"
    assert readme_problems(block, root) == []
    (root / "demo/adapter/adapter_model.safetensors").write_bytes(b"another adapter")
    assert readme_problems(block, root) == [f"{source} (bench): the README's table differs from the file's figures"]
    # Re-rendered, the block says it is not yet measured on the committed model, and what measures it.
    assert render_block(source, "bench", root) == (
        "*Not yet measured on the committed demo model (these figures were measured on an earlier model or "
        "adapter): `gatehead figures --only bench-demo`.*\n")
    stale = f"<!-- figures {source} bench -->\n{render_block(source, 'bench', root)}<!-- /figures -->"
    assert readme_problems(stale, root) == []


def test_a_demo_kit_results_file_of_other_weights_is_caught(tmp_path: Path) -> None:
    """`demo.build evaluate` files carry the weights' sha256 prefixes; the README check compares them."""
    import hashlib

    source = "results/test-sets.json"
    weights = "adapter-suffix/adapter_model.safetensors"
    (tmp_path / "demo" / weights).parent.mkdir(parents=True)
    shutil.copy(figures.ROOT / "demo" / weights, tmp_path / "demo" / weights)
    # A results file's shape (an earlier model's figures, kept in the history) naming the committed gate.
    results = json.loads((figures.ROOT / "docs/history/12.8m-figures/demo-test.json").read_text())["results"]
    results["weights_sha256"] = {weights: hashlib.sha256((tmp_path / "demo" / weights).read_bytes()).hexdigest()[:16]}
    (tmp_path / source).parent.mkdir(parents=True)
    (tmp_path / source).write_text(json.dumps(results))
    block = f"<!-- figures {source} demo-sets -->\n{render_block(source, 'demo-sets', tmp_path)}<!-- /figures -->"
    assert readme_problems(block, tmp_path) == []
    (tmp_path / "demo" / weights).write_bytes(b"retrained")
    assert readme_problems(block, tmp_path) == [
        f"{source} (demo-sets): the README's table differs from the file's figures"]
    assert render_block(source, "demo-sets", tmp_path).endswith(f"{source} (of other {weights}).*\n")
