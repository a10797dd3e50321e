"""Where a gated turn's time goes against a turn of stock vLLM: more engine steps, or slower ones, and why.

Run by hand or as `gatehead figures --only turn-cost-demo`: `python -m gatehead.benchmarks.turn_cost
[--model demo|random] [--out FILE]` (nothing else should run on the machine). Three of `gatehead bench`'s
setups, (c0) stock vLLM with no gate, (a') the suffix-mode gate and (a'-overlap) its answer beside the gate,
run the bench's single-turn workload (the same questions, every turn answered) at each concurrency, both
engines started once and the setups' order rotated from run to run (so no setup always runs first or on
the warmest engine). Around each it reads, per turn:
- the wall time: end-to-end p50 as the bench reports it, and the workload's wall time per turn (where the
  engine never idles, at concurrency 4 and 8, the inverse of throughput);
- the engine's work from vLLM's own step stats: engine steps, prompt tokens prefilled (not read from the
  prefix cache: counted once per request, at its first token), tokens sampled (a gate's one included);
  and the mean wall time of a step (the workload's wall time over its steps);
- the gate branch's wall time in the worker (the plugin's timer);
- the CPU time of this process: the agent, retrieval's embedder, and vLLM's client side (input processing,
  detokenising, the output handler), which shares the cores with the engine.
Against (c0), run by run, a gated turn's extra wall time splits exactly into more steps (the extra steps at
(c0)'s step time) and slower steps (the gated setup's steps times the extra per step). The engine's own CPU
time is not read: vLLM's worker polls for its next step with `sched_yield` for up to a second after each,
so its CPU time follows wall time, not work. Medians (min-max) over `--runs` runs. Prints the tables;
writes JSON; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETUPS = ("c0_stock", "a_suffix", "a_overlap")
SETUP_NAMES = {"c0_stock": "(c0) stock vLLM", "a_suffix": "(a') suffix-mode gate",
               "a_overlap": "(a'-overlap) answer beside the gate"}
COUNTERS = ("steps", "prompt_tokens_computed", "generation_tokens", "gate_requests", "generation_requests")


async def reading(engine: Any) -> dict[str, float]:
    """The engine's counters and the branch's seconds (vLLM's step stats, the plugin's timer), this process's
    CPU seconds, and the time."""
    stats = await engine.stats()
    cpu = os.times()
    return {**{k: float(stats.get(k, 0.0)) for k in (*COUNTERS, "branch_seconds")},
            "front_cpu_s": cpu.user + cpu.system, "wall_s": time.perf_counter()}


def per_turn(before: dict[str, float], after: dict[str, float], turns: int) -> dict[str, float]:
    """What one turn cost on average between two readings: counts per turn, times in ms per turn, and the
    mean wall time of an engine step."""
    delta = {k: after[k] - before[k] for k in before}
    out = {k: delta[k] / turns for k in COUNTERS}
    out.update(wall_ms=1000 * delta["wall_s"] / turns, branch_ms=1000 * delta["branch_seconds"] / turns,
               front_cpu_ms=1000 * delta["front_cpu_s"] / turns,
               step_ms=1000 * delta["wall_s"] / delta["steps"] if delta["steps"] else float("nan"))
    return out


async def measure_setup(agent: Any, engine: Any, questions: Sequence[str], concurrency: Sequence[int],
                        answer_tokens: int) -> dict[str, dict[str, float]]:
    """One setup, one run: the single-turn workload at each concurrency, read before and after."""
    from gatehead.benchmarks.side_by_side import single_turn

    out = {}
    for c in concurrency:
        await engine.reset_prefix_cache()
        before = await reading(engine)
        summary = await single_turn(agent, questions, c, answer_tokens)
        after = await reading(engine)
        await asyncio.sleep(0.2)  # vLLM may record the last step's stats just after its outputs: read them too
        counted = await reading(engine)
        after.update({k: counted[k] for k in (*COUNTERS, "branch_seconds")})
        out[f"c{c}"] = {"turns_per_s": summary["turns_per_s"], "e2e_p50_ms": summary["e2e_p50_ms"],
                        "gate_mean_ms": summary["gate_mean_ms"], "ttft_mean_ms": summary["ttft_mean_ms"],
                        **per_turn(before, after, summary["turns"])}
    return out


def added(gated: dict[str, float], stock: dict[str, float]) -> dict[str, float]:
    """What a gated turn adds against a (c0) turn of the same run: each figure's difference, the ratios, and
    the extra wall time per turn split into more steps and slower steps (the two add up to it)."""
    out = {name: gated[name] - stock[name] for name in gated if name != "turns_per_s"}
    out.update(e2e_ratio=gated["e2e_p50_ms"] / stock["e2e_p50_ms"], wall_ratio=gated["wall_ms"] / stock["wall_ms"],
               more_steps_ms=(gated["steps"] - stock["steps"]) * stock["step_ms"],
               slower_steps_ms=gated["steps"] * (gated["step_ms"] - stock["step_ms"]))
    return out


def differences(runs: list[dict]) -> dict:
    """Per gated setup and concurrency, `added` run by run (run i of each setup against run i of (c0));
    medians (min-max) over the runs."""
    from gatehead.benchmarks.bench_report import spread

    return {setup: {level: spread([added(r[setup][level], r["c0_stock"][level]) for r in runs])
                    for level in runs[0]["c0_stock"]}
            for setup in SETUPS[1:]}


def run(model: str, runs: int, questions: int, concurrency: tuple[int, ...], answer_tokens: int,
        log=print) -> dict[str, Any]:
    """Both engines started once; each run measures every setup, in an order rotated by one from run to run."""
    from gatehead.agent import Agent
    from gatehead.benchmarks.bench_report import spread
    from gatehead.benchmarks.side_by_side import BenchConfig, bench_models, bench_questions, layouts, single_turn
    from gatehead.demo.index import open_demo_store
    from gatehead.gate.adapter import load_gate_adapter

    model_dir, adapter_dir, suffix, window = bench_models(model, ROOT / ".cache" / "bench-random")
    config = BenchConfig(model=model_dir, adapter=adapter_dir, suffix_adapter=suffix, memory_fraction=0.2,
                         max_model_len=window, block_size=32, setups=SETUPS, workloads=("single",),
                         questions=questions, concurrency=concurrency, answer_tokens=answer_tokens, runs=runs,
                         target_set="demo" if model == "demo" else "random")
    adapter = load_gate_adapter(config.adapter, config.model)
    by_run: list[dict] = [{} for _ in range(runs)]
    with tempfile.TemporaryDirectory(prefix="gatehead-turn-cost-") as tmp:
        store = open_demo_store(Path(tmp) / "qdrant", log=lambda *_: None)
        started = []
        try:
            for layout in layouts(config, adapter, Path(tmp) / "dedicated"):
                layout.start()
                started.append(layout)

            async def measure() -> None:  # one event loop for the engines' whole life, as vLLM's client needs
                setups = {s.key: (Agent(s.peer, store, s.agent_config), layout.engine)
                          for layout in started for s in layout.measured()}
                for agent, _ in setups.values():  # first-request costs out of the figures
                    await single_turn(agent, bench_questions(2, offset=200), 2, answer_tokens)
                for i in range(runs):
                    for key in SETUPS[i % len(SETUPS):] + SETUPS[:i % len(SETUPS)]:
                        log(f"run {i + 1}/{runs}: {SETUP_NAMES[key]}")
                        by_run[i][key] = await measure_setup(*setups[key], bench_questions(questions), concurrency,
                                                             answer_tokens)

            asyncio.run(measure())
        finally:
            for layout in started:
                layout.shutdown()
            store.close()
    return {"config": {"model": model, "runs": runs, "questions": questions, "concurrency": list(concurrency),
                       "answer_tokens": answer_tokens, "dtype": config.dtype, "block_size": config.block_size,
                       "memory_fraction": config.memory_fraction},
            "runs": by_run, "setups": spread(by_run), "against_c0": differences(by_run)}


def breakdown_table(result: dict) -> str:
    """Per setup and concurrency, what a turn cost (medians over the runs)."""
    lines = ["| setup | c | e2e p50 ms | wall ms per turn | engine steps | ms per step | prefilled tokens | "
             "sampled tokens | branch ms | front-end CPU ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        for level, f in result["setups"][setup].items():
            lines.append(f"| {SETUP_NAMES[setup]} | {level[1:]} | {f['e2e_p50_ms']['median']:,.0f} | "
                         f"{f['wall_ms']['median']:,.0f} | {f['steps']['median']:.1f} | "
                         f"{f['step_ms']['median']:.1f} | {f['prompt_tokens_computed']['median']:,.0f} | "
                         f"{f['generation_tokens']['median']:.1f} | {f['branch_ms']['median']:.1f} | "
                         f"{f['front_cpu_ms']['median']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from gatehead.provenance import described_commit, machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("demo", "random"), default="demo")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--questions", type=int, default=32, help="turns per concurrency level (default 32)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--answer-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.questions < 1 or min(args.concurrency) < 1:
        parser.error("--runs, --questions and --concurrency take values >= 1")
    argv = sys.argv[1:] if argv is None else argv
    result = {"command": " ".join(["python -m gatehead.benchmarks.turn_cost", *argv]),
              "commit": described_commit(), "machine": machine(),
              **run(args.model, args.runs, args.questions, tuple(args.concurrency), args.answer_tokens,
                    log=lambda m: print(m, file=sys.stderr, flush=True))}
    print(breakdown_table(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
