"""Qwen2 and Llama: the same fidelity checks as Qwen3, on tiny models of each architecture."""

from __future__ import annotations

import pytest

from gatehead.evals.agreement import shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_requests
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.tiny import TinySpec, build_tiny


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def arch_engines(request, tmp_path_factory):
    arch = request.param
    spec = TinySpec(arch=arch, hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32)
    tiny = build_tiny(tmp_path_factory.mktemp(arch), spec)
    common = dict(model=tiny.model_dir, kv_cache_memory_bytes=128 << 20, enforce_eager=True, block_size=32,
                  max_model_len=1024)
    stock, shared = SharedEngine(EngineConfig(**common)), SharedEngine(EngineConfig(adapter=tiny.adapter_dir, **common))
    yield arch, tiny, stock, shared
    stock.shutdown()
    shared.shutdown()


def test_stability_and_agreement(arch_engines, loop, fp32_judge) -> None:
    arch, tiny, stock, shared = arch_engines
    built = [shared.prompts.build(r.question, r.passages, r.conversation) for r in synthetic_requests(64, seed=1)]
    stability = loop.run(check_stability(stock, shared, [b.answer for b in built], 128, [b.gate for b in built]))
    print(f"{arch} mixed stability: {stability}")
    assert stability.passed, stability
    gates = [shared.prompts.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(256, 3)]
    engine, floor, factor = fp32_judge(loop.run(shared_gate_probs(shared, gates)), tiny, gates, shared.config.dtype)
    print(f"{arch} shared vs the reference: {engine}\n{arch} HF {shared.config.dtype} vs the reference: {floor}")
    # A random adapter is judged on |dp| (DESIGN): the engine's gate is no further from the more precise
    # reference than HF's own gate in the host's dtype (twice that in fp32: `against_fp32`). Flip counts are
    # printed; at a handful per 256 they are noise for random weights.
    assert engine.max_dp <= factor * floor.max_dp and engine.mean_dp <= factor * floor.mean_dp


def test_unsupported_architecture_is_refused(tmp_path) -> None:
    import json

    tiny = build_tiny(tmp_path, TinySpec())
    spec = json.loads((tiny.adapter_dir / "gate.json").read_text())
    config = json.loads((tiny.model_dir / "config.json").read_text())
    config["architectures"] = ["MistralForCausalLM"]
    (tiny.model_dir / "config.json").write_text(json.dumps(config))
    spec["base"]["architecture"] = "MistralForCausalLM"
    (tiny.adapter_dir / "gate.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"supports \['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'\]"):
        SharedEngine(EngineConfig(model=tiny.model_dir, adapter=tiny.adapter_dir))
