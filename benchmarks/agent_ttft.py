"""The answer's time to first token after the gate vs cold, on the demo model and the shared engine.

Run by hand: `python benchmarks/agent_ttft.py [--questions 40] [--turns 3]`. For each answerable
held-out demo question (with the documents the real retriever returned for it):
- cold: the prefix cache emptied, then the answer prompt streamed; time to its first token;
- after the gate: the prefix cache emptied, the gate request run, then the same answer prompt streamed.
The answer prompt is the gate prompt's prefix plus the assistant start, so after the gate only the
last partial block and the assistant start are computed. Single-turn and multi-turn (the question
after `--turns` earlier question/answer turns) are reported separately: the gate re-reads the whole
thread each turn, so multi-turn prompts are longer on both paths. Prints JSON; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from gatehead.demo import ADAPTER_DIR
from gatehead.demo.base import ensure_demo_model
from gatehead.demo.splits import held_out_examples
from gatehead.gate.prompt import Turn
from gatehead.provenance import machine
from gatehead.runtime.engine import EngineConfig, SharedEngine


async def ttft(engine: SharedEngine, prompt) -> tuple[float, int]:
    started = time.perf_counter()
    async for out in engine.stream(prompt, max_tokens=1):
        return time.perf_counter() - started, out.num_cached_tokens
    raise RuntimeError("no output")


async def measure(engine: SharedEngine, items) -> dict:
    cold, warm, cached, lengths = [], [], [], []
    for question, passages, conversation in items:
        prompt = engine.prompts.build(question, passages, conversation)
        await engine.reset_prefix_cache()
        seconds, _ = await ttft(engine, prompt.answer)
        cold.append(seconds)
        await engine.reset_prefix_cache()
        await engine.gate_prompt(prompt.gate)
        seconds, hit = await ttft(engine, prompt.answer)
        warm.append(seconds)
        cached.append(hit)
        lengths.append(len(prompt.answer))
    return {"requests": len(items), "prompt_tokens_mean": statistics.mean(lengths),
            "cached_tokens_mean": statistics.mean(cached),
            "cold_ttft_ms_median": 1000 * statistics.median(cold),
            "after_gate_ttft_ms_median": 1000 * statistics.median(warm),
            "cold_ttft_ms_mean": 1000 * statistics.mean(cold), "after_gate_ttft_ms_mean": 1000 * statistics.mean(warm),
            "ratio_of_medians": statistics.median(warm) / statistics.median(cold)}


async def run(engine: SharedEngine, questions: int, turns: int) -> dict:
    examples = [e for e in held_out_examples() if e.label == "answer"]
    single = [(e.question, e.passages, ()) for e in examples[:questions]]
    history = []
    for e in examples[questions:questions + turns]:
        history += [Turn("user", e.question), Turn("assistant", "(an earlier answer) [1]")]
    multi = [(e.question, e.passages, tuple(history)) for e in examples[:questions]]
    await measure(engine, single[:3])  # warm-up: first-request costs out of the figures
    return {"single_turn": await measure(engine, single), f"multi_turn_{turns}_earlier": await measure(engine, multi)}


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="vLLM compile mode instead of eager")
    parser.add_argument("--block-size", type=int, help="KV block size (default: vLLM's; prefix hits are whole blocks)")
    args = parser.parse_args()
    engine = SharedEngine(EngineConfig(model=ensure_demo_model(), adapter=ADAPTER_DIR, enforce_eager=not args.compile,
                                       kv_cache_memory_bytes=256 << 20, max_model_len=2048,
                                       block_size=args.block_size))
    block_size = engine.llm.vllm_config.cache_config.block_size
    try:
        figures = asyncio.run(run(engine, args.questions, args.turns))
    finally:
        engine.shutdown()
    print(json.dumps({"machine": machine(), "mode": "compile" if args.compile else "eager",
                      "block_size": block_size, **figures}, indent=2))


if __name__ == "__main__":
    main()
