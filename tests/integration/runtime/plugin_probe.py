"""Run by tests/integration/runtime/test_stock_plugins.py as a script, in vLLM's default multi-process layout.

Starts a stock engine, the dedicated gate engine and a shared engine one after another, and asks each
engine-core process (the worker runs in it on CPU) which gatehead modules it imported and whether the
model runner's forward carries gatehead's wrapper. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path


def probe(_worker) -> dict:
    """Runs in the engine process (pickled by value: this file is `__main__` there is none of gatehead)."""
    import sys as engine_sys

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return {"gatehead_modules": sorted(m for m in engine_sys.modules if m == "gatehead" or m.startswith("gatehead.")),
            "forward_wrapped": bool(getattr(GPUModelRunner._model_forward, "gatehead_wrapped", False))}


async def main(model: Path, adapter: Path, export: Path) -> dict:
    from gatehead.benchmarks.peers import DedicatedGate
    from gatehead.runtime.engine import EngineConfig, SharedEngine

    found = {}
    for name, adapter_dir in (("stock", None), ("shared", adapter)):
        engine = SharedEngine(EngineConfig(model=model, adapter=adapter_dir, kv_cache_memory_bytes=64 << 20,
                                           enforce_eager=True, block_size=32, max_model_len=512))
        try:
            found[name] = (await engine.llm.collective_rpc(probe))[0]
        finally:
            engine.shutdown()
    gate = DedicatedGate(export, max_model_len=512, memory_fraction=0.05, eager=True, block_size=32)
    try:
        found["dedicated"] = (await gate.llm.collective_rpc(probe))[0]
    finally:
        gate.shutdown()
    return found


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(*map(Path, sys.argv[1:4])))))
