"""The demo as a user meets it: time to ready, the first turn, then each gate and each answered turn.

Run by hand: `python -m gatehead.benchmarks.demo_turns [--dtype auto|bfloat16|float32] [--no-warm-up]
[--runs 3] [--setups suffix,prompt] [--out FILE]`. Each run starts the engine as `gatehead
demo` does (the demo model and gate, eager, 256 MiB of KV), opens the demo index, and asks the scripted demo
questions (`gatehead demo`'s) in their threads, twice over: the first pass's first turn is what a user waits
for after start, and every later turn is timed as it comes. Per run: seconds to ready (engine start and,
unless `--no-warm-up`, `SharedEngine.warm_up`), the first gate and first turn, and the medians of the gate
call (every gate node) and of the answered turns after the first; then medians of the runs with their
spread. `--no-warm-up` measures the engine as it was before warm-up existed. The dtype line and the CPU kind
say what ran (runtime/dtype.py). `--setups` names the gates compared (`SETUPS`: the demo model with its
suffix-mode gate, the default, or its prompt-mode gate); their runs are interleaved (run 1 of each, then
run 2 of each, ...) so that every setup meets the same machine. A setup named with `:vllm-binding`
(`suffix:vllm-binding`) starts its engine under vLLM's own CPU binding (`VLLM_CPU_OMP_THREADS_BIND=auto`:
one core per worker kept for the scheduler) instead of gatehead's (`runtime/cpu_setup.py`), to measure
what the set-up changes. Writes JSON; asserts nothing. (The results
files named `12.8m` were measured on the 12.8 M model that came before, in git history.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from gatehead import demo
from gatehead.runtime.dtype import KIND_NAMES, cpu_kind, dtype_reason

# name: (model, gate adapter)
SETUPS = {"suffix": (demo.MODEL_DIR, demo.SUFFIX_ADAPTER_DIR), "prompt": (demo.MODEL_DIR, demo.ADAPTER_DIR)}
VLLM_BINDING = ":vllm-binding"  # a setup under vLLM's own CPU binding, not gatehead's


def _median_spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def _gate_seconds(result) -> list[float]:
    return [t["seconds"] for t in result.timings if t["node"] == "gate"]


async def _session(engine, store, warm_up: bool, started: float) -> dict:
    from gatehead.agent import Agent, AgentConfig
    from gatehead.agent.checkpoint import open_checkpointer
    from gatehead.demo import DEMO_QUESTIONS

    if warm_up:
        await engine.warm_up()
    ready = time.perf_counter() - started
    turns, gates = [], []
    run = uuid.uuid4().hex[:8]
    async with open_checkpointer(":memory:") as saver:
        agent = Agent(engine, store, AgentConfig(), saver)
        for repeat in range(2):
            for thread, question in DEMO_QUESTIONS:
                began = time.perf_counter()
                result = await agent.ask(question, f"bench-{run}-{repeat}-{thread}")
                turns.append((time.perf_counter() - began, result.decision))
                gates += _gate_seconds(result)
    first_turn, first_gate = turns[0][0], gates[0]
    answered = [seconds for seconds, decision in turns[1:] if decision == "answer"]
    return {"ready_seconds": round(ready, 2), "first_gate_seconds": round(first_gate, 3),
            "first_turn_seconds": round(first_turn, 3), "gate_median_seconds": round(statistics.median(gates[1:]), 3),
            "answered_turn_median_seconds": round(statistics.median(answered), 3),
            "first_gate_over_next_five": round(first_gate / statistics.median(gates[1:6]), 2),
            "turns": len(turns), "answered_turns": len(answered) + (turns[0][1] == "answer")}


def one_run(dtype: str, warm_up: bool, setup: str = "suffix") -> dict:
    from gatehead.demo.base import ensure_demo_model
    from gatehead.demo.index import CORPUS, demo_store_config
    from gatehead.retrieval.ingest import open_store
    from gatehead.runtime.cpu_setup import bound_to
    from gatehead.runtime.engine import EngineConfig, SharedEngine

    gate, vllm_binding = setup.removesuffix(VLLM_BINDING), setup.endswith(VLLM_BINDING)
    model, adapter = SETUPS[gate]
    ensure_demo_model()  # the demo model is built on first use
    store = open_store(demo_store_config(), (CORPUS,), log=lambda m: print(m, file=sys.stderr))
    try:
        started = time.perf_counter()
        with bound_to("auto" if vllm_binding else None):
            engine = SharedEngine(EngineConfig(model=model, adapter=adapter, enforce_eager=True,
                                               kv_cache_memory_bytes=256 << 20, dtype=dtype))
        try:
            figures = asyncio.run(_session(engine, store, warm_up, started))
        finally:
            engine.shutdown()
    finally:
        store.close()
    # The binding the engine's workers got: gatehead's mask, or vLLM's own (`auto`, or a caller's variable).
    return {"dtype": engine.config.dtype, "binding": engine.cpu_set_up.binding or "vllm", **figures}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--no-warm-up", action="store_true", help="start as before SharedEngine.warm_up existed")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--setups", default="suffix", help=f"comma-separated, of {', '.join(SETUPS)}, each also "
                        f"with {VLLM_BINDING} (vLLM's own CPU binding)")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    setups = args.setups.split(",")
    if unknown := [s for s in setups if s.removesuffix(VLLM_BINDING) not in SETUPS]:
        parser.error(f"unknown setup {unknown[0]!r}: choose from {', '.join(SETUPS)}")
    runs = {setup: [] for setup in setups}
    for _ in range(args.runs):
        for setup in setups:
            runs[setup].append(one_run(args.dtype, not args.no_warm_up, setup))
    keys = [k for k, v in runs[setups[0]][0].items() if isinstance(v, float)]
    from datetime import datetime, timezone

    from gatehead.digest import fingerprint  # sha256 of the folders, as figures' envelopes record them
    from gatehead.provenance import described_commit, machine
    from gatehead.runtime import cpu_setup

    result = {"command": " ".join(["python -m gatehead.benchmarks.demo_turns", *(argv or sys.argv[1:])]),
              "commit": described_commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(),
              "fingerprints": {setup: {"model": fingerprint(Path(SETUPS[setup.removesuffix(VLLM_BINDING)][0])),
                                       "adapter": fingerprint(Path(SETUPS[setup.removesuffix(VLLM_BINDING)][1]))}
                               for setup in setups},
              "cpu": KIND_NAMES[cpu_kind()], "emulated_kind": os.environ.get("GATEHEAD_TEST_CPU_ISA", "native"),
              "dtype": dtype_reason(runs[setups[0]][0]["dtype"]), "warm_up": not args.no_warm_up,
              "preload": cpu_setup.libraries() if os.environ.get(cpu_setup.VARIABLE, "1") not in ("0", "false", "no")
              else [],
              "setups": {setup: {"medians": {k: _median_spread([r[k] for r in runs[setup]]) for k in keys},
                                 "runs": runs[setup]} for setup in setups}}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
