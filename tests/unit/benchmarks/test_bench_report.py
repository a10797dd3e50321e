"""`gatehead bench`'s arithmetic over runs: medians with their spread, run-by-run ratios, the targets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest import approx

from gatehead.benchmarks.bench_report import ratios, spread, tables, targets


def prefix_row(gate_cached_ms: float) -> dict:
    return {"target_tokens": 256, "gate_prompt_tokens": 260, "gate_cold_ms": 50.0,
            "gate_cached_prefix_ms": gate_cached_ms, "cold_ttft_ms": 40.0, "after_gate_ttft_ms": 10.0}


def single(seconds: float) -> dict:
    """A workload's figures where every turn takes `seconds`, one at a time."""
    return {"turns_per_s": 1 / seconds, "e2e_p50_ms": 1000 * seconds, "e2e_p95_ms": 1000 * seconds,
            "gate_mean_ms": 1.0, "ttft_mean_ms": 1.0, "wasted_tokens_mean": 0.0, "wasted_tokens_max": 0}


def run(overlap_s: float, split_s: float, shared_s: float, stock_s: float, ungated_s: float, judge_ms: float) -> dict:
    """One run's setups: (a'-overlap), (b) in both bindings, (c0), (c), (d) after a cached prefix (ms), (a')
    1 ms slower than (a'-overlap); the same seconds at concurrency 1 and 4."""
    def levels(seconds: float) -> dict:
        return {"single_c1": single(seconds), "single_c4": single(seconds)}

    return {"a_suffix": {**levels(overlap_s + 0.001), "prefix_reuse": [prefix_row(10.0)]},
            "a_overlap": {**levels(overlap_s), "refuse_c1": {**single(0.2), "wasted_tokens_mean": 3.0,
                                                             "wasted_tokens_max": 5}},
            "b_split": levels(split_s), "b_shared": levels(shared_s), "c0_stock": levels(stock_s),
            "c_ungated": levels(ungated_s),
            "d_judge": {"prefix_reuse": [prefix_row(judge_ms)]}}


def figures_of(runs: list[dict], target_set: str = "random") -> dict:
    figures = {"setups": spread(runs), "ratios": spread([ratios(r) for r in runs]), "target_set": target_set,
               "memory": {"kv_ratio_shared_suffix_vs_stock": 0.985}}
    return {**figures, "targets": targets(figures)}


def test_spread_reports_median_min_max_and_keeps_labels() -> None:
    out = spread([{"x": 3.0, "label": "a", "rows": [1, 5]}, {"x": 1.0, "label": "a", "rows": [2, 6]},
                  {"x": 2.0, "label": "a", "rows": [3, 4]}])
    assert out["x"] == {"median": 2.0, "min": 1.0, "max": 3.0} and out["label"] == "a"
    assert out["rows"] == [{"median": 2.0, "min": 1.0, "max": 3.0}, {"median": 5.0, "min": 4.0, "max": 6.0}]


def test_ratios_take_stock_vllm_as_the_denominator_and_the_better_binding_of_two_engines() -> None:
    r = ratios(run(1.04, 2.0, 2.5, 1.0, 1.01, 20.0))
    assert r["single_c1_e2e_p50_a_overlap_over_c0"] == approx(1.04)  # over (c0), not over (c)
    assert r["single_c1_throughput_a_overlap_over_b"] == approx(2.0 / 1.04)  # (b) split, the faster binding here
    assert r["single_c1_e2e_p50_c_ungated_over_c0"] == approx(1.01)
    assert r["single_c1_throughput_c_ungated_over_c0"] == approx(1 / 1.01)
    assert ratios(run(1.04, 3.0, 2.5, 1.0, 1.0, 20.0))["single_c1_throughput_a_overlap_over_b"] == approx(2.5 / 1.04)
    assert r["prefix_gate_cached_a_suffix_over_d"] == {256: 0.5}


def test_targets_are_judged_on_the_medians_of_run_by_run_ratios() -> None:
    # Overlapped turns of 1.04 s against 1.00 s on stock vLLM and 2.0 s with two engines; the judge 20 ms
    # after a cached prefix against the suffix gate's 10 ms. One outlier run must not decide a target.
    runs = [run(1.04, 2.0, 2.5, 1.0, 1.01, 20.0), run(1.04, 2.0, 2.5, 1.0, 1.01, 20.0),
            run(1.5, 1.0, 1.0, 1.0, 1.5, 5.0)]
    figures = figures_of(runs, "demo")
    verdict = figures["targets"]
    assert verdict["overlap_e2e_p50_within_10pct_of_stock"]["met"]
    assert verdict["suffix_gate_latency_at_most_the_judges"]["met"]
    assert verdict["plugin_cost_within_2pct"]["met"]
    assert not verdict["kv_capacity_within_1pct_of_stock"]["met"]
    assert "overlap_throughput_at_least_1.8x_two_engines" not in verdict  # no such demo target
    assert figures["ratios"]["single_c1_e2e_p50_a_overlap_over_c0"]["max"] == 1.5
    text = tables(figures)
    assert "(a'-overlap) (a'), answer beside the gate" in text and "Refused turns, concurrency 1" in text


def test_the_random_models_targets() -> None:
    met = figures_of([run(1.04, 2.0, 2.5, 1.0, 1.01, 20.0)] * 3)["targets"]
    assert met["overlap_e2e_p50_within_5pct_of_stock"]["met"]
    assert met["overlap_throughput_at_least_1.8x_two_engines"] == {"met": True, "values": {
        "single_c4_throughput_a_overlap_over_b": approx(2.0 / 1.04)}}  # judged at concurrency 4 and above only
    # From 1k tokens on: the 256-token row is not judged (no row left, no target).
    assert not any(k.startswith("suffix_gate_latency") for k in met)
    missed = figures_of([run(1.06, 1.8, 3.0, 1.0, 1.03, 20.0)] * 3)["targets"]
    assert not missed["overlap_e2e_p50_within_5pct_of_stock"]["met"]  # 6% over stock vLLM
    assert not missed["overlap_throughput_at_least_1.8x_two_engines"]["met"]  # 1.8 / 1.06 = 1.70x
    assert not missed["plugin_cost_within_2pct"]["met"]  # the plugin 3% slower


def test_the_remote_gates_targets_compare_it_with_the_same_gate_in_process() -> None:
    def with_remote(seconds: float) -> dict:
        one = run(1.04, 2.0, 2.5, 1.0, 1.01, 20.0)  # (a') turns take 1.041 s, (b) split 2.0 s
        return {**one, "a_remote": {"single_c1": single(seconds), "single_c4": single(seconds)}}

    r = ratios(with_remote(1.1451))
    assert r["single_c4_e2e_p50_a_remote_over_a_suffix"] == approx(1.1)
    assert r["single_c4_throughput_a_remote_over_b"] == approx(2.0 / 1.1451)
    near = figures_of([with_remote(1.09)] * 3, "demo")["targets"]
    assert near["remote_e2e_p50_within_10pct_of_in_process"]["met"]
    assert near["remote_lead_over_two_engines_within_10pct_of_in_process"]["met"]
    far = figures_of([with_remote(1.2)] * 3, "demo")["targets"]  # 15% slower than in process
    assert not far["remote_e2e_p50_within_10pct_of_in_process"]["met"]
    assert not far["remote_lead_over_two_engines_within_10pct_of_in_process"]["met"]  # 1.041 / 1.2 = 0.87
    assert "(a'-remote) (a') in `vllm serve`, over HTTP" in tables(figures_of([with_remote(1.09)] * 3, "demo"))


def test_the_bench_runs_each_setup_on_its_layout_of_engines_in_order(tiny) -> None:
    from gatehead.benchmarks.side_by_side import SETUPS, BenchConfig, layouts

    config = BenchConfig(model=tiny.model_dir, adapter=tiny.adapter_dir, suffix_adapter=tiny.adapter_dir,
                         cores="0-1", setups=tuple(SETUPS))
    found = [(layout.name, layout.keys) for layout in layouts(config, tiny.adapter, tiny.model_dir)]
    assert found == [("shared_prompt", ("c_ungated",)), ("shared_suffix", ("a_suffix", "a_overlap")),
                     ("stock", ("c0_stock", "d_judge")),
                     ("shared_suffix_priority", ("a_suffix_prio", "a_overlap_prio")),
                     ("two_engines", ("b_split",)), ("two_engines", ("b_shared",)), ("remote_suffix", ("a_remote",)),
                     ("shared_prompt", ("a_prompt",))]
    # The priority-scheduler setups run on an engine of their own, scheduling by priority; the rest first come.
    policies = {x.name: x.policy for x in layouts(config, tiny.adapter, tiny.model_dir) if hasattr(x, "policy")}
    assert policies == {"shared_prompt": "fcfs", "shared_suffix": "fcfs", "stock": "fcfs",
                        "shared_suffix_priority": "priority"}
    two = [layout for layout in layouts(config, tiny.adapter, tiny.model_dir) if layout.name == "two_engines"]
    assert [(t.gen_cores, t.gate_cores) for t in two] == [([0], [1]), ([0, 1], [0, 1])]
    # Memory alone still starts the prompt-mode shared engine and the stock one; one binding alone, one (b).
    only = BenchConfig(model=tiny.model_dir, adapter=tiny.adapter_dir, cores="0-1", setups=("b_shared",),
                       two_engine_cores=("shared",))
    assert [(x.name, x.keys) for x in layouts(only, tiny.adapter, tiny.model_dir)] == [
        ("shared_prompt", ()), ("stock", ()), ("two_engines", ("b_shared",))]
    with pytest.raises(ValueError, match="two_engine_cores"):
        BenchConfig(model=tiny.model_dir, adapter=tiny.adapter_dir, two_engine_cores=("both",))


def test_rounds_start_every_layout_afresh_and_alternate_the_order() -> None:
    from types import SimpleNamespace

    from gatehead.benchmarks.side_by_side import rounds

    shared, stock, memory_only, two = (SimpleNamespace(name=n, keys=k) for n, k in (
        ("shared", ("c_ungated",)), ("stock", ("c0_stock", "d_judge")), ("prompt", ()), ("two", ("b_split",))))
    order = rounds([shared, stock, memory_only, two], 3)
    assert [[x.name for x in r] for r in order] == [["shared", "stock", "prompt", "two"], ["two", "stock", "shared"],
                                                   ["shared", "stock", "two"]]
    # Each setup runs first, or last, in some round: none always takes the machine just after a start.
    assert {r[0].name for r in order} == {"shared", "two"}
    assert rounds([shared], 1) == [[shared]]


def test_the_default_setups_are_those_the_adapters_and_bindings_allow() -> None:
    from gatehead.benchmarks.side_by_side import SETUPS, default_setups

    prio = ("a_suffix_prio", "a_overlap_prio")  # only when asked for
    assert default_setups(Path("suffix"), ("split", "shared")) == tuple(s for s in SETUPS if s not in prio)
    assert default_setups(None, ("shared",)) == tuple(s for s in SETUPS if s not in ("a_suffix", "a_overlap",
                                                                                    "a_remote", "b_split", *prio))


def _part(results: dict, keys: set[str], workloads: list[str], concurrency: list[int], memory: bool) -> dict:
    """`results` as a run over `keys` of every setup alone would have written it."""
    runs = [{setup: {k: v for k, v in figures.items() if k in keys} for setup, figures in run.items()}
            for run in results["runs"]]
    return {**results, "command": f"bench {workloads} {concurrency}", "runs": runs,
            "config": {**results["config"], "workloads": workloads, "concurrency": concurrency},
            "memory": results["memory"] if memory else {}, "seconds": 10.0}


def test_runs_over_other_workloads_merge_into_the_whole_runs_figures() -> None:
    import json

    from gatehead.benchmarks.bench_report import merge

    whole = json.loads((Path(__file__).parents[3] / "docs/figures/bench-demo.json").read_text())["results"]
    keys = {k for run in whole["runs"] for figures in run.values() for k in figures}
    assert {"single_c1", "single_c8", "multi_turn", "refuse_c4", "prefix_reuse"} <= keys
    parts = [_part(whole, {"single_c1", "refuse_c1"}, ["single", "refuse"], [1], False),
             _part(whole, {"single_c4", "single_c8", "refuse_c4", "refuse_c8"}, ["single", "refuse"], [4, 8], False),
             _part(whole, {"multi_turn"}, ["multi"], [1, 4, 8], False),
             _part(whole, {"prefix_reuse"}, ["prefix", "memory"], [1, 4, 8], True)]
    merged = merge(parts)
    assert merged["setups"] == spread(whole["runs"])
    assert merged["ratios"] == spread([ratios(r) for r in whole["runs"]])
    assert merged["targets"] == targets({**whole, "ratios": merged["ratios"]})
    assert set(merged["targets"]) == set(whole["targets"]) and merged["seconds"] == 40.0  # every target, judged
    assert merged["config"]["workloads"] == ["memory", "multi", "prefix", "refuse", "single"]
    with pytest.raises(ValueError, match="measured by more than one"):
        merge([parts[0], parts[0]])
    with pytest.raises(ValueError, match="differ in machine"):
        merge([parts[0], {**parts[1], "machine": {**whole["machine"], "cpus": 4}}])
    with pytest.raises(ValueError, match="same setups"):
        merge([parts[0], {**parts[1], "runs": parts[1]["runs"][:2]}])
    with pytest.raises(ValueError, match="differ in config"):
        merge([parts[0], {**parts[1], "config": {**parts[1]["config"], "questions": 8}}])
    with pytest.raises(ValueError, match="differ in target_set"):
        merge([parts[0], {**parts[1], "target_set": "random"}])
    with pytest.raises(ValueError, match="memory measured by more than one"):
        merge([parts[3], {**parts[0], "config": {**parts[0]["config"], "workloads": ["single", "memory"]}}])
