"""One gate request on a long, already-cached conversation: a prompt-mode gate against a suffix-mode gate.

Run by hand: `python -m gatehead.benchmarks.suffix_latency [--tokens N] [--out FILE]` (the demo model and
its two gates, `demo/adapter` and `demo/adapter-suffix`, each on its own shared engine, eager, in the
host's dtype: bf16 where native, else fp32; CPU is fine; nothing else should run on the machine). A gate
prompt of about `--tokens` tokens (a question over many demo passages) is gated once, which fills the
prefix cache, then gated again `--runs` times alone: a prompt-mode gate recomputes the whole prompt
through all N layers and the branch over every row (it may not read the cache), a suffix-mode gate
reads every whole block before its suffix and computes the suffix rows only. Writes one JSON object:
per gate, each run's seconds, their median and spread, and the prompt tokens read from the cache; the
ratio of the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path


def long_gate_prompt(engine, tokens: int) -> list[int]:
    """A demo question over distinct retrieved demo passages, added while the gate prompt stays within `tokens`."""
    from gatehead.demo.splits import held_out_examples

    examples = held_out_examples()
    question, passages = examples[0].question, []
    prompt = engine.prompts.build(question, passages).gate
    for passage in dict.fromkeys(p for e in examples for p in e.passages):
        trial = engine.prompts.build(question, [*passages, passage]).gate
        if len(trial) > tokens or len(trial) <= len(prompt):  # too long, or the builder dropped a passage
            break
        passages.append(passage)
        prompt = trial
    return list(prompt)


def measure(adapter: Path, tokens: int, runs: int) -> dict:
    from gatehead.demo.base import ensure_demo_model
    from gatehead.runtime.engine import EngineConfig, SharedEngine

    engine = SharedEngine(EngineConfig(model=ensure_demo_model(), adapter=adapter, enforce_eager=True,
                                       memory_fraction=0.1, block_size=32, max_model_len=2048))
    try:
        prompt = long_gate_prompt(engine, tokens)

        async def run() -> tuple[list[float], list[int], dict]:
            first = await engine.gate_prompt(prompt)  # fills the prefix cache
            seconds, cached = [], []
            for _ in range(runs):
                started = time.perf_counter()
                outcome = await engine.gate_prompt(prompt)
                seconds.append(time.perf_counter() - started)
                cached.append(outcome.num_cached_tokens)
            return seconds, cached, first.result.probs

        seconds, cached, probs = asyncio.run(run())
    finally:
        engine.shutdown()
    return {"adapter": adapter.name, "activation": engine.adapter.spec.activation, "prompt_tokens": len(prompt),
            "cached_tokens": cached, "seconds": seconds, "median_s": statistics.median(seconds),
            "spread_s": max(seconds) - min(seconds), "probs": probs}


def main() -> None:
    from gatehead.demo import ADAPTER_DIR, SUFFIX_ADAPTER_DIR, kit_name
    from gatehead.demo.base import ensure_demo_model
    from gatehead.provenance import described_commit, machine, versions
    from gatehead.runtime.dtype import cpu_bf16_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1900, help="gate prompt length to aim at (default 1900)")
    parser.add_argument("--runs", type=int, default=3, help="timed gate requests per gate (default 3)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    gates = {name: measure(path, args.tokens, args.runs)
             for name, path in (("prompt", ADAPTER_DIR), ("suffix", SUFFIX_ADAPTER_DIR))}
    result = {"command": "python -m gatehead.benchmarks.suffix_latency"
                         + (f" --tokens {args.tokens}" if args.tokens != 1900 else "")
                         + (f" --runs {args.runs}" if args.runs != 3 else ""),
              "commit": described_commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "cpu_bf16_path": cpu_bf16_path(), "versions": versions(),
              "weights_sha256": {kit_name(p): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
                                 for d in (ensure_demo_model(), ADAPTER_DIR, SUFFIX_ADAPTER_DIR)
                                 for p in sorted(d.glob("*.safetensors"))},
              "gates": gates,
              "median_ratio_prompt_over_suffix": gates["prompt"]["median_s"] / gates["suffix"]["median_s"]}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
