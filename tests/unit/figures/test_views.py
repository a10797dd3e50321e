"""Views: those that judge targets say, from the envelope's own figures, which hold on the CPU it names; the
GPU branch's view shows what `gpu_branch --combine` writes, a value all runs gave alike included."""

from __future__ import annotations

import json
from pathlib import Path

from gatehead.benchmarks.gpu_branch import combine
from gatehead.figures import VIEWS


def _turns_envelope(dtype: str, turn: float, first: float) -> dict:
    def spread(median: float) -> dict:
        return {"median": median, "min": median * 0.9, "max": median * 1.1}

    medians = {"gate_median_seconds": spread(turn / 3), "answered_turn_median_seconds": spread(turn),
               "first_turn_seconds": spread(first), "ready_seconds": spread(20.0)}
    return {"command": "python -m gatehead.benchmarks.demo_turns --setups suffix --out OUT.json",
            "date": "2026-12-06T00:00:00Z", "machine": {"cpus": 2, "bf16": "AVX-512 BF16"},
            "results": {"dtype": dtype, "setups": {"suffix": {"medians": medians, "runs": [{}, {}, {}]}}}}


def test_the_demo_turns_targets_follow_the_cpu_the_envelope_names() -> None:
    view = VIEWS["demo-turns"]
    # Run in fp32 (a CPU without native bf16, here an AVX2 one emulated on a bf16 host): a 2.5 s bound.
    text = view([_turns_envelope("float32 (CPU: AVX2 without AVX-512, ...)", turn=2.0, first=1.5)])
    assert "<= 2.5 s on this CPU (no native bf16)" in text
    assert "suffix mode: answered turn 2.000 s (met), first turn 0.75x (met)" in text
    # bf16 native: 1.5 s; a first turn over twice the median misses too.
    text = view([_turns_envelope("bfloat16 (CPU: AVX-512 BF16)", turn=2.0, first=4.5)])
    assert "<= 1.5 s on this CPU (bf16 native)" in text
    assert "suffix mode: answered turn 2.000 s (**missed**), first turn 2.25x (**missed**)" in text
    assert "| suffix mode | 0.667 s (0.600-0.733) | 2.000 s (1.800-2.200) | 4.500 s | 2.25x | 20.0 s |" in text


def test_the_demo_turns_under_vllms_binding_are_shown_but_not_judged() -> None:
    envelope = _turns_envelope("float32 (CPU: AVX2 without AVX-512, ...)", turn=2.0, first=1.5)
    setups = envelope["results"]["setups"]
    setups["suffix:vllm-binding"] = _turns_envelope("float32", turn=3.0, first=7.0)["results"]["setups"]["suffix"]
    text = VIEWS["demo-turns"]([envelope])
    assert "| suffix mode, vLLM's CPU binding | 1.000 s (0.900-1.100) | 3.000 s (2.700-3.300) | 7.000 s |" in text
    targets = text.split("Targets:")[1]
    assert "suffix mode: answered turn 2.000 s (met)" in targets and "vLLM" not in targets


def test_the_gpu_branch_view_shows_a_timing_every_run_gave_alike() -> None:
    envelope = json.loads((Path(__file__).parents[3] / "docs/figures/gpu-branch.json").read_text())
    runs = [{"suffix_branch_cuda_graph": t, "ratio_cuda_graph": 0.00315, "cached_prefix_tokens": 8192}
            for t in (3.061, 3.058, 3.072)]
    merged = combine(runs)
    assert merged == {"suffix_branch_cuda_graph": {"median": 3.061, "min": 3.058, "max": 3.072},
                      "ratio_cuda_graph": 0.00315, "cached_prefix_tokens": 8192}
    envelope["results"]["suffix_mode_ms"][-1].update(merged)
    envelope["results"]["suffix_mode_ms"][0]["ratio_cuda_graph"] = {"median": 0.0104, "min": 0.0098, "max": 0.011}
    text = VIEWS["gpu-branch"]([envelope])
    *_, row = (line for line in text.splitlines() if line.startswith("| 8,192 tokens"))
    assert row.endswith("| 3.06 (3.06-3.07) | 0.0032 (every run) |"), row
    assert "as a CUDA graph 2,048 tokens 1.04% (**missed**), 8,192 tokens 0.32% (met);" in text


def test_a_test_figure_labelled_differently_per_run_gets_a_row_per_label() -> None:
    def envelope(bf16: str, label: str, value: dict) -> dict:
        return {"command": "pytest", "date": "2026-12-06T00:00:00Z", "machine": {"cpus": 2, "bf16": bf16},
                "results": {"outcomes": {"passed": 1}, "figures": {
                    "demo/agreement/bf16-fp32": {"label": label, "value": value},
                    "demo/chunked": {"label": "chunked", "value": {"max_abs_dp": 0.0}}}}}

    text = VIEWS["tests-demo"]([envelope("AVX-512 BF16", "gate, HF bf16 vs HF fp32", {"max_abs_dp": 0.11}),
                                envelope("AVX2", "gate, HF fp64 vs HF fp32", {"max_abs_dp": 6.7e-06})])
    rows = [line for line in text.splitlines() if line.startswith("| gate")]
    assert len(rows) == 2
    assert rows[0].startswith("| gate, HF bf16 vs HF fp32 |") and rows[0].endswith("| - |")
    assert rows[1].startswith("| gate, HF fp64 vs HF fp32 | - |")


def test_a_benchs_parts_from_several_commits_make_one_table_that_names_each_parts_commit() -> None:
    import pytest

    from gatehead.benchmarks.bench_report import merge, readme_tables

    whole = json.loads((Path(__file__).parents[3] / "docs/figures/bench-demo.json").read_text())
    results = whole["results"]

    def part(item: str, commit: str, keys: set[str], workloads: list[str], memory: bool) -> dict:
        runs = [{setup: {k: v for k, v in figures.items() if k in keys} for setup, figures in run.items()}
                for run in results["runs"]]
        return {**whole, "item": item, "commit": commit, "command": f"bench {item}",
                "results": {**results, "runs": runs, "config": {**results["config"], "workloads": workloads},
                            "memory": results["memory"] if memory else {}}}

    single = {k for run in results["runs"] for figures in run.values() for k in figures if k.startswith(
        ("single_", "refuse_"))}
    parts = [part("bench-x-single", "a" * 40, single, ["single", "refuse"], False),
             part("bench-x-threads", "b" * 40, {"multi_turn"}, ["multi"], False),
             part("bench-x-prefix", "b" * 40, {"prefix_reuse"}, ["prefix", "memory"], True)]
    text = VIEWS["bench"](parts)
    table = readme_tables(merge([{**p["results"], "command": p["command"]} for p in parts]))
    assert text == table + (
        "\n*The parts were measured at 2 commits (bench-x-single at aaaaaaa; bench-x-threads, bench-x-prefix at "
        "bbbbbbb); every ratio reads one part. What changed between them: `git diff --stat aaaaaaa bbbbbbb -- . "
        "':!docs' ':!tests'`.*\n")
    assert VIEWS["bench"]([{**p, "commit": "a" * 40} for p in parts]) == table  # one commit: no such line
    with pytest.raises(ValueError, match="one bench's parts measure one model"):
        VIEWS["bench"]([parts[0], {**parts[1], "fingerprints": {"model": "another"}}])
