"""Gate agreement: the shared engine's gate against the dedicated gate engine and the HF reference.

Flips are decisions that differ at the adapter's thresholds; |dp| is the largest difference of any
class probability. The decision mix says whether flips could happen at all (with every decision in
one class they mean nothing). The dedicated engine is stock vLLM's pooling runner on the checkpoint
`gatehead export-dedicated` writes: no gatehead code runs in it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gatehead.gate.policy import LABELS, Thresholds, decide_all
from gatehead.runtime.engine import SharedEngine


@dataclass(frozen=True)
class Agreement:
    """How two gates' probabilities over the same prompts compare."""

    n: int
    flips: int
    max_dp: float
    mean_dp: float
    mix_a: dict[str, int]
    mix_b: dict[str, int]


def agreement(a: np.ndarray, b: np.ndarray, thresholds: Thresholds) -> Agreement:
    """Compare probability arrays [n, 3] (canonical label order)."""
    assert a.shape == b.shape and a.shape[1] == len(LABELS)
    da, db = decide_all(a.tolist(), thresholds), decide_all(b.tolist(), thresholds)
    dp = np.abs(a - b).max(axis=1) if len(a) else np.zeros(0)
    return Agreement(len(a), sum(x != y for x, y in zip(da, db, strict=True)), float(dp.max(initial=0.0)),
                     float(dp.mean()) if len(dp) else 0.0, dict(Counter(da)), dict(Counter(db)))


async def shared_gate_probs(engine: SharedEngine, prompts: Sequence[Sequence[int]],
                            mixed_generations: Sequence[Sequence[int]] = (), max_tokens: int = 16) -> np.ndarray:
    """Gate probabilities [n, 3] from the shared engine, with generations running in the same batches."""
    gates = [engine.gate_prompt(p) for p in prompts]
    generations = [engine.generate(g, max_tokens=max_tokens, ignore_eos=True) for g in mixed_generations]
    results = await asyncio.gather(*gates, *generations)
    return np.array([[o.result.probs[label] for label in LABELS] for o in results[:len(prompts)]])


def dedicated_gate_probs(export_dir: str | Path, prompts: Sequence[Sequence[int]], labels: Sequence[str],
                         **engine_args) -> np.ndarray:
    """Gate probabilities [n, 3] (canonical order) from stock vLLM's pooling runner on `export_dir`."""
    from vllm import LLM

    llm = LLM(model=str(export_dir), runner="pooling", **engine_args)
    try:
        outputs = llm.classify([{"prompt_token_ids": list(p)} for p in prompts], use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
    order = [list(labels).index(label) for label in LABELS]
    return np.array([[o.outputs.probs[i] for i in order] for o in outputs])
