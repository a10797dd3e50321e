"""The turn breakdown's arithmetic: readings to per-turn costs, run-by-run differences against (c0) whose
parts add up, and the view that renders them."""

from __future__ import annotations

import pytest

from gatehead.benchmarks.bench_report import spread
from gatehead.benchmarks.turn_cost import COUNTERS, added, breakdown_table, differences, per_turn
from gatehead.figures import VIEWS


def _reading(**values: float) -> dict[str, float]:
    return {**dict.fromkeys((*COUNTERS, "branch_seconds", "front_cpu_s", "wall_s"), 0.0), **values}


def test_per_turn_divides_counts_and_gives_times_in_milliseconds() -> None:
    before = _reading(steps=10, prompt_tokens_computed=100, front_cpu_s=2.0, branch_seconds=0.5, wall_s=100.0)
    after = _reading(steps=50, prompt_tokens_computed=900, generation_tokens=64, gate_requests=4,
                     generation_requests=4, front_cpu_s=2.4, branch_seconds=0.58, wall_s=102.0)
    got = per_turn(before, after, turns=4)
    assert got["steps"] == 10 and got["prompt_tokens_computed"] == 200 and got["generation_tokens"] == 16
    assert got["gate_requests"] == got["generation_requests"] == 1
    assert got["wall_ms"] == pytest.approx(500.0) and got["step_ms"] == pytest.approx(50.0)
    assert got["front_cpu_ms"] == pytest.approx(100.0) and got["branch_ms"] == pytest.approx(20.0)


def _figures(e2e: float, steps: float, step_ms: float, branch: float = 0.0, front: float = 100.0) -> dict:
    return {"turns_per_s": 1000 / (steps * step_ms), "e2e_p50_ms": e2e, "gate_mean_ms": 0.0, "ttft_mean_ms": e2e / 3,
            "steps": steps, "prompt_tokens_computed": 300.0, "generation_tokens": 8.0, "gate_requests": 1.0,
            "generation_requests": 1.0, "wall_ms": steps * step_ms, "step_ms": step_ms, "branch_ms": branch,
            "front_cpu_ms": front}


def test_the_extra_wall_time_splits_into_more_steps_and_slower_steps() -> None:
    stock, gated = _figures(1000, steps=10, step_ms=20), _figures(1150, steps=11, step_ms=22, branch=6, front=130)
    got = added(gated, stock)
    assert got["wall_ms"] == pytest.approx(42.0)  # 11 x 22 - 10 x 20
    assert got["more_steps_ms"] == pytest.approx(20.0)  # one more step at (c0)'s 20 ms
    assert got["slower_steps_ms"] == pytest.approx(22.0)  # 11 steps, 2 ms slower each
    assert got["more_steps_ms"] + got["slower_steps_ms"] == pytest.approx(got["wall_ms"])
    assert got["e2e_ratio"] == pytest.approx(1.15) and got["wall_ratio"] == pytest.approx(242 / 200)
    assert got["branch_ms"] == 6 and got["front_cpu_ms"] == 30 and "turns_per_s" not in got


def _runs() -> list[dict]:
    runs = []
    for scale in (1.0, 1.1, 0.9):  # the machine drifts between runs; each run's setups drift alike
        runs.append({"c0_stock": {"c4": _figures(1000 * scale, 10, 20 * scale)},
                     "a_suffix": {"c4": _figures(1300 * scale, 12, 20 * scale, branch=8)},
                     "a_overlap": {"c4": _figures(1100 * scale, 10, 22 * scale, branch=8, front=120)}})
    return runs


def test_differences_are_taken_run_by_run_against_c0() -> None:
    runs = _runs()
    overlap = differences(runs)["a_overlap"]["c4"]
    # Run by run the ratio is 1.1 every time: the spread shows none of the drift.
    assert overlap["e2e_ratio"] == {"median": pytest.approx(1.1), "min": pytest.approx(1.1), "max": pytest.approx(1.1)}
    assert overlap["wall_ms"] == {"median": pytest.approx(20.0), "min": pytest.approx(18.0), "max": pytest.approx(22.0)}
    assert overlap["more_steps_ms"]["median"] == 0 and overlap["slower_steps_ms"]["median"] == pytest.approx(20.0)
    assert overlap["front_cpu_ms"]["median"] == pytest.approx(20.0) and overlap["branch_ms"]["median"] == 8
    suffix = differences(runs)["a_suffix"]["c4"]
    assert suffix["more_steps_ms"]["median"] == pytest.approx(40.0) and suffix["steps"]["median"] == 2
    assert "c0_stock" not in differences(runs)
    assert spread(runs)["c0_stock"]["c4"]["e2e_p50_ms"] == {"median": 1000.0, "min": 900.0, "max": 1100.0}


def test_the_view_renders_both_tables_from_the_envelope() -> None:
    runs = _runs()
    results = {"config": {"dtype": "bfloat16", "questions": 32, "runs": 3}, "runs": runs, "setups": spread(runs),
               "against_c0": differences(runs)}
    envelope = {"command": "python -m gatehead.benchmarks.turn_cost --model demo --out OUT.json",
                "date": "2026-12-07T00:00:00Z", "machine": {"cpus": 2, "bf16": "AVX-512 BF16"}, "results": results}
    text = VIEWS["turn-cost"]([envelope])
    assert breakdown_table(results) in text
    assert breakdown_table(results).splitlines()[2].startswith("| (c0) stock vLLM | 4 | 1,000 | 200 | 10.0 | 20.0 |")
    assert ("| (a'-overlap) answer beside the gate | 4 | 1.10 (1.10-1.10) | 1.10 (1.10-1.10) | +20 | +0 | +20 | 8.0 "
            "| +0.0 | +0.0 | +0.0 | +20 |") in text
