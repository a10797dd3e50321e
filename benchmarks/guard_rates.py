"""The degenerate-output guard's false positives on clean output and detection of injected faults.

Run by hand: `python -m gatehead.benchmarks.guard_rates [--limit N] [--out FILE]` (the demo model on
the shared engine, CPU is fine). Clean outputs: the demo model's answers to every labelled demo
question of the training and validation splits with the documents retrieved for it
(`demo/data/{train,val}.jsonl`; the test split is sealed, `gatehead.demo.sealed`), greedy and sampled at
temperature 0.8, each with its token ids, text and sampled-token logprobs, checked as a stream is
(`Checker`, at every token). Faults are injected into each clean answer:
- repetition: a unit of 1-16 vocabulary tokens repeated until 64 tokens are appended, each given
  logprob -0.5 (a loop the model is sure of, so only the repetition rule can see it);
- byte garbage: 8 random bytes decoded with replacement, inserted into the text;
- script soup: Latin letters of two appended words swapped for Cyrillic look-alikes;
- improbable: 12 random vocabulary tokens appended, each with the logprob the model itself gives
  it in that place (scored by the engine: prompt + answer + the tokens as one prompt).
Faults made inside the engine (`--engine-faults N`, the first N questions): each prompt is answered
once (its blocks now in the prefix cache), then the engine's KV cache is corrupted with the fault
drill (`SharedEngine.inject_fault`) and the prompts answered again, reading the corrupted blocks:
- kv_zeroed: every cached block zeroed, as a block read before it was written;
- kv_negated: every cached block's keys and values negated.
Only answers that changed count as faulty; the guard checks them as it checks a stream.
Prints one JSON object: per set, how many outputs and how many tripped, by reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import Counter
from pathlib import Path

from gatehead.runtime.engine import final_output
from gatehead.runtime.guard import Checker, GuardConfig

HOMOGLYPHS = str.maketrans({"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х"})


def stream_check(config: GuardConfig, ids, text: str, logprobs, tokenizer, forbidden) -> str | None:
    """Check a generation as `guarded` does: once per token, on its prefix."""
    checker = Checker(config, forbidden)
    for n in range(1, len(ids) + 1):
        prefix_text = text if n == len(ids) else tokenizer.decode(ids[:n])
        trip = checker(ids[:n], prefix_text, logprobs[:n])
        if trip is not None:
            return trip.reason
    return None


async def generate(engine, items, temperature: float):
    outs = []
    for i in range(0, len(items), 64):
        chunk = items[i:i + 64]
        outs += await asyncio.gather(*(engine.generate(p.answer, max_tokens=64, temperature=temperature)
                                       for p in chunk))
    return outs


async def scored(engine, prompt_ids, answer_ids, extra) -> list[float]:
    """The model's logprob of each `extra` token after the prompt and the answer."""
    from vllm import SamplingParams

    ids = list(prompt_ids) + list(answer_ids) + list(extra)
    final = await final_output(engine.llm.generate({"prompt_token_ids": ids},
                                                   SamplingParams(max_tokens=1, prompt_logprobs=0),
                                                   request_id=f"score-{random.random()}"))
    entries = final.prompt_logprobs[-len(extra):]
    return [entry[token].logprob for entry, token in zip(entries, extra, strict=True)]


async def engine_faults(engine, prompts, config: GuardConfig) -> dict:
    """The kv_zeroed and kv_negated sets (module docstring)."""
    tokenizer, forbidden = engine.tokenizer, engine.gate_reserved
    results = {}
    for name, scale in (("kv_zeroed", 0.0), ("kv_negated", -1.0)):
        await engine.reset_prefix_cache()
        clean = await generate(engine, prompts, 0.0)  # their prompts' blocks are now cached
        await engine.inject_fault("kv", scale)
        try:
            faulty = await generate(engine, prompts, 0.0)
        finally:  # dropped from the cache, the corrupted blocks are written afresh before any read
            assert await engine.reset_prefix_cache(), "blocks still held after the drill"
        changed = [f for c, f in zip(clean, faulty, strict=True) if f.token_ids != c.token_ids]
        trips = Counter(stream_check(config, f.token_ids, f.text, f.logprobs, tokenizer, forbidden) for f in changed)
        results[f"engine_{name}"] = {"outputs": len(prompts), "changed": len(changed),
                                     "detected": len(changed) - trips[None],
                                     "by_reason": {k: v for k, v in trips.items() if k},
                                     "examples": [f.text[:80] for f in changed[:5]]}
    return results


async def run(limit: int | None, config: GuardConfig, engine_fault_count: int = 0) -> dict:
    from gatehead.demo import ADAPTER_DIR
    from gatehead.demo.base import ensure_demo_model
    from gatehead.demo.splits import held_out_examples
    from gatehead.runtime.engine import EngineConfig, SharedEngine

    r = random.Random(0)
    examples = held_out_examples(("train", "val"))[:limit]
    engine = SharedEngine(EngineConfig(model=ensure_demo_model(), adapter=ADAPTER_DIR, kv_cache_memory_bytes=512 << 20,
                                       max_model_len=2048, enforce_eager=True, block_size=32))
    try:
        tokenizer, forbidden = engine.tokenizer, engine.gate_reserved
        vocab = [t for t in range(len(tokenizer)) if t not in forbidden and t != tokenizer.eos_token_id
                 and t != tokenizer.pad_token_id]
        prompts = [engine.prompts.build(e.question, e.passages) for e in examples]
        started = time.time()
        clean = {"greedy": await generate(engine, prompts, 0.0), "sampled": await generate(engine, prompts, 0.8)}
        generation_s = time.time() - started
        results: dict = {}
        for name, outs in clean.items():
            trips = Counter(stream_check(config, o.token_ids, o.text, o.logprobs, tokenizer, forbidden) for o in outs)
            results[f"clean_{name}"] = {"outputs": len(outs), "tripped": len(outs) - trips[None],
                                        "by_reason": {k: v for k, v in trips.items() if k}}
        faults: dict[str, Counter] = {k: Counter() for k in ("repetition", "byte_garbage", "script_soup", "improbable")}
        for prompt, out in zip(prompts, clean["greedy"], strict=True):
            ids, text, lps = list(out.token_ids), out.text, list(out.logprobs)
            if ids and ids[-1] == tokenizer.eos_token_id:  # faults follow the answer's last word
                ids, lps = ids[:-1], lps[:-1]
            unit = [r.choice(vocab) for _ in range(r.randint(1, 16))]
            loop = (unit * 64)[:64]  # 4 repeats of the longest unit the guard looks for
            faults["repetition"][stream_check(config, ids + loop, tokenizer.decode(ids + loop), lps + [-0.5] * 64,
                                              tokenizer, forbidden)] += 1
            cut = r.randrange(len(text) + 1)
            garbage = bytes(r.randrange(256) for _ in range(8)).decode("utf-8", errors="replace")
            bad = text[:cut] + garbage + text[cut:]
            bad_ids = tokenizer.encode(bad, add_special_tokens=False)
            faults["byte_garbage"][stream_check(config, bad_ids, bad, [-0.5] * len(bad_ids), tokenizer,
                                                forbidden)] += 1
            soup = text + " " + "Rowan Lantern".translate(HOMOGLYPHS)
            soup_ids = tokenizer.encode(soup, add_special_tokens=False)
            faults["script_soup"][stream_check(config, soup_ids, soup, [-0.5] * len(soup_ids), tokenizer,
                                               forbidden)] += 1
            noise = [r.choice(vocab) for _ in range(12)]
            noise_lps = await scored(engine, prompt.answer, ids, noise)
            faults["improbable"][stream_check(config, ids + noise, tokenizer.decode(ids + noise), lps + noise_lps,
                                              tokenizer, forbidden)] += 1
        for name, trips in faults.items():
            results[f"fault_{name}"] = {"outputs": sum(trips.values()), "detected": sum(trips.values()) - trips[None],
                                        "by_reason": {k: v for k, v in trips.items() if k}}
        results["generation_seconds"] = round(generation_s, 1)
        if engine_fault_count:
            drilled = [engine.prompts.build(e.question, e.passages)
                       for e in held_out_examples(("train", "val"))[:engine_fault_count]]
            results.update(await engine_faults(engine, drilled, config))
        return results
    finally:
        engine.shutdown()


def main() -> None:
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout carries the JSON
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, help="the first N labelled questions only")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--improbable-logprob", type=float, default=GuardConfig.improbable_logprob)
    parser.add_argument("--engine-faults", type=int, default=300,
                        help="questions answered again after the KV cache is corrupted (0: none)")
    args = parser.parse_args()
    config = GuardConfig(improbable_logprob=args.improbable_logprob)
    results = {"guard": {"improbable_logprob": config.improbable_logprob, "improbable_run": config.improbable_run},
               **asyncio.run(run(args.limit, config, args.engine_faults))}
    text = json.dumps(results, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
