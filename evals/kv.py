"""KV cost: what the shared engine's plugin costs in KV capacity and memory, against stock vLLM.

Both engines are started at the same memory fraction (or the same explicit KV size) one after the
other; their KV capacity is what vLLM allocated. vLLM's CPU worker sizes KV by memory fraction as
the fraction of NUMA node 0 less its own process's RSS, so each engine's core runs in a freshly
spawned process (`fresh_engine_process`): in-process, or forked, its RSS would include whatever the
caller holds, and the order the engines start in would decide the comparison. The plugin's own
allocations are itemised by the worker (`SharedEngine.plugin_memory`). Weights memory is the bytes
of the tensors each setup loads: one shared engine loads the base checkpoint (plus the adapter's
LoRA and head); two engines load the base for generation plus the dedicated gate checkpoint
(`gatehead export-dedicated`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from gatehead.runtime.engine import SharedEngine


@contextmanager
def fresh_engine_process() -> Iterator[None]:
    """Engines started inside run their core in a spawned process of its own (vLLM's default layout, spawned)."""
    from vllm import envs

    names = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
    envs.disable_envs_cache()  # an in-process engine started earlier caches the variables
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def checkpoint_bytes(directory: str | Path, dtype: str | None = None) -> int:
    """Bytes of every tensor in a safetensors checkpoint directory: as stored, or with `dtype` ('bfloat16',
    'float32') as an engine that loads it in that dtype holds it (floating tensors at that width), so that
    checkpoints stored in different dtypes are counted alike."""
    from safetensors import safe_open

    width = {None: None, "bfloat16": 2, "float32": 4}[dtype]
    total = 0
    for path in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                sliced = f.get_slice(key)
                count = 1
                for dim in sliced.get_shape():
                    count *= dim
                stored = sliced.get_dtype()
                floating = stored in ("F64", "F32", "BF16", "F16")
                total += count * (width if width and floating else _dtype_bytes(stored))
    return total


def _dtype_bytes(name: str) -> int:
    return {"F64": 8, "F32": 4, "I64": 8, "I32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1, "BOOL": 1}[name]


def run_kv(config, out=None, work_dir=None):
    """The KV eval (`gatehead eval kv`): capacity stock vs shared, plugin memory, weights memory."""
    from tqdm import tqdm

    from gatehead.evals.plots import paired_bars
    from gatehead.evals.run import Outcome, table
    from gatehead.runtime.dedicated import export_dedicated

    progress = tqdm(total=3, desc="kv: engines and checkpoints", unit="step")
    capacity = {}
    plugin: dict[str, int] = {}
    for name, cfg in (("stock", replace(config, adapter=None)), ("shared", config)):
        with fresh_engine_process():
            engine = SharedEngine(cfg)
        try:
            capacity[name] = {"blocks": engine.kv_blocks, "tokens": engine.kv_tokens,
                              "block_size": int(engine.llm.vllm_config.cache_config.block_size)}
            if name == "shared":
                import asyncio

                plugin = asyncio.run(engine.plugin_memory())
        finally:
            engine.shutdown()
        progress.update()
    base = checkpoint_bytes(config.model, config.dtype)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        dedicated = checkpoint_bytes(export_dedicated(config.model, config.adapter, Path(tmp) / "dedicated",
                                                      dtype=config.dtype), config.dtype)
    progress.update()
    progress.close()
    one = base + plugin.get("lora_and_head", 0)
    two = base + dedicated
    ratio = capacity["shared"]["tokens"] / capacity["stock"]["tokens"]
    passed = ratio >= 0.99
    mib = 1 << 20
    sizing = (f"explicit KV size {config.kv_cache_memory_bytes / mib:.0f} MiB" if config.kv_cache_memory_bytes
              else f"memory fraction {config.memory_fraction}")
    report = (f"Both engines at {sizing}, {config.dtype}; model `{config.model}`.\n\n"
              + table(["engine", "KV blocks", "KV tokens", "block size"],
                      [[n, c["blocks"], c["tokens"], c["block_size"]] for n, c in capacity.items()])
              + f"\nShared / stock KV tokens: {ratio:.4f} (rule: >= 0.99).\n\n"
              + table(["plugin allocation", "MiB"], [[k, v / mib] for k, v in plugin.items()])
              + "\n" + table(["setup", "weights MiB"], [["one shared engine (base + LoRA + head)", one / mib],
                                                        ["two engines (base + dedicated gate)", two / mib],
                                                        ["saved by sharing", (two - one) / mib]]))
    plot = paired_bars(out / "kv.png", ["KV tokens", "weights MiB"],
                       [capacity["stock"]["tokens"], two / mib], [capacity["shared"]["tokens"], one / mib],
                       "stock engine / two engines", "shared engine", "", "KV capacity and weights memory")
    summary = {"kv_ratio": round(ratio, 5), "stock_tokens": capacity["stock"]["tokens"],
               "shared_tokens": capacity["shared"]["tokens"], "weights_one_mib": round(one / mib, 2),
               "weights_two_mib": round(two / mib, 2)}
    return Outcome(passed, {"capacity": capacity, "kv_ratio": ratio, "plugin_bytes": plugin,
                            "weights_bytes": {"base": base, "dedicated": dedicated, "one_engine": one,
                                              "two_engines": two}}, report, [plot], summary)
