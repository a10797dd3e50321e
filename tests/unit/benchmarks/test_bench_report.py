"""`gatehead bench`'s arithmetic over runs: medians with their spread, run-by-run ratios, the targets."""

from __future__ import annotations

from gatehead.benchmarks.bench_report import ratios, spread, tables, targets


def prefix_row(gate_cached_ms: float) -> dict:
    return {"target_tokens": 256, "gate_prompt_tokens": 260, "gate_cold_ms": 50.0,
            "gate_cached_prefix_ms": gate_cached_ms, "cold_ttft_ms": 40.0, "after_gate_ttft_ms": 10.0}


def run(suffix_s: float, two_s: float, ungated_s: float, judge_ms: float) -> dict:
    def single(turns_per_s: float, p50: float) -> dict:
        return {"turns_per_s": turns_per_s, "e2e_p50_ms": p50, "e2e_p95_ms": p50, "gate_mean_ms": 1.0,
                "ttft_mean_ms": 1.0}

    return {"a_suffix": {"single_c1": single(1 / suffix_s, 1000 * suffix_s),
                         "prefix_reuse": [prefix_row(10.0)]},
            "b_two_engines": {"single_c1": single(1 / two_s, 1000 * two_s)},
            "c_ungated": {"single_c1": single(1 / ungated_s, 1000 * ungated_s)},
            "d_judge": {"prefix_reuse": [prefix_row(judge_ms)]}}


def test_spread_reports_median_min_max_and_keeps_labels() -> None:
    out = spread([{"x": 3.0, "label": "a", "rows": [1, 5]}, {"x": 1.0, "label": "a", "rows": [2, 6]},
                  {"x": 2.0, "label": "a", "rows": [3, 4]}])
    assert out["x"] == {"median": 2.0, "min": 1.0, "max": 3.0} and out["label"] == "a"
    assert out["rows"] == [{"median": 2.0, "min": 1.0, "max": 3.0}, {"median": 5.0, "min": 4.0, "max": 6.0}]


def test_targets_are_judged_on_the_medians_of_run_by_run_ratios() -> None:
    # Suffix-mode turns of 1.05 s against 1.00 s ungated and 2.0 s with two engines; the judge 20 ms after
    # a cached prefix against the suffix gate's 10 ms. One outlier run must not decide a target.
    runs = [run(1.05, 2.0, 1.0, 20.0), run(1.05, 2.0, 1.0, 20.0), run(1.5, 1.0, 1.0, 5.0)]
    figures = {"setups": spread(runs), "ratios": spread([ratios(r) for r in runs]),
               "memory": {"kv_ratio_shared_suffix_vs_stock": 0.985}}
    verdict = targets(figures)
    assert verdict["suffix_gate_adds_at_most_10pct_to_e2e_p50"]["met"]
    assert verdict["suffix_throughput_at_least_1.5x_two_engines"]["met"]
    assert verdict["suffix_gate_latency_at_most_the_judges"]["met"]
    assert not verdict["kv_capacity_within_1pct_of_stock"]["met"]
    assert figures["ratios"]["single_c1_e2e_p50_a_suffix_over_c"]["max"] == 1.5
    assert "(a') shared, suffix-mode gate" in tables({**figures, "targets": verdict})
    slow = [run(1.2, 2.0, 1.0, 20.0)] * 3  # 20% over the ungated turn
    assert not targets({"setups": spread(slow), "ratios": spread([ratios(r) for r in slow]),
                        "memory": {}})["suffix_gate_adds_at_most_10pct_to_e2e_p50"]["met"]
