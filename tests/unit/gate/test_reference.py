"""The HF reference against a hand-written Qwen3 forward with the LoRA delta merged into the weights."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gatehead.gate.prompt import Passage, Turn
from gatehead.gate.reference import HFReference
from gatehead.tiny import TinyModel

QUESTIONS = ["How long is the warranty?", "Who won the match?", "Reset the router?", "Price of the premium plan?"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions[:, None].double() * inv_freq[None, :]  # [T, D/2]
    cos, sin = torch.cat([angles.cos(), angles.cos()], -1).float(), torch.cat([angles.sin(), angles.sin()], -1).float()
    half = torch.cat([-x[..., dim // 2:], x[..., : dim // 2]], -1)
    return x * cos[:, None, :] + half * sin[:, None, :]  # x: [T, H, D]


def merged_weights(tiny: TinyModel) -> dict[str, torch.Tensor]:
    """Base weights in fp32 with W += scale * B @ A on every LoRA-targeted module."""
    weights = {k: v.float() for k, v in load_file(tiny.model_dir / "model.safetensors").items()}
    lora = load_file(tiny.adapter_dir / "adapter_model.safetensors")
    scale = tiny.adapter.scaling
    for name, a in lora.items():
        if ".lora_A." in name:
            b = lora[name.replace("lora_A", "lora_B")]
            target = name.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
            weights[target] = weights[target] + scale * (b.float() @ a.float())
    weights["score.weight"] = lora["base_model.model.score.weight"].float()
    return weights


def qwen3_gate_logits(w: dict[str, torch.Tensor], config: dict, ids: list[int]) -> torch.Tensor:
    """Qwen3 forward from the paper's equations (no transformers code), head on the last token."""
    eps, theta = config["rms_norm_eps"], config["rope_parameters"]["rope_theta"]
    n_heads, n_kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    positions = torch.arange(len(ids))
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]  # [T, hidden]
    mask = torch.full((len(ids), len(ids)), float("-inf")).triu(1)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(len(ids), n_heads, head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(len(ids), n_kv, head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(len(ids), n_kv, head_dim)
        q = rotate(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), positions, theta)
        k = rotate(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), positions, theta)
        k, v = k.repeat_interleave(n_heads // n_kv, 1), v.repeat_interleave(n_heads // n_kv, 1)
        scores = torch.einsum("thd,shd->hts", q, k) / head_dim**0.5 + mask  # [H, T, T]
        attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(len(ids), -1)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(x[-1], w["model.norm.weight"], eps) @ w["score.weight"].T


@pytest.fixture(scope="module")
def reference(tiny: TinyModel) -> HFReference:
    return HFReference(tiny.model_dir, tiny.adapter_dir, dtype="float32")


def test_reference_matches_hand_written_forward_with_merged_lora(tiny: TinyModel, reference: HFReference) -> None:
    from gatehead.gate.prompt import PromptBuilder, PromptConfig

    builder = PromptBuilder(reference.tokenizer, "<|gate|>", PromptConfig(max_context=1024))
    docs = [Passage("The warranty covers defects for two years.", "Warranty", "w.md", 0.9)]
    prompts = [builder.build(q, docs, [Turn("user", "hi"), Turn("assistant", "hello")]).gate for q in QUESTIONS]
    config = json.loads((Path(tiny.model_dir) / "config.json").read_text())
    weights = merged_weights(tiny)
    with torch.no_grad():
        expected = np.stack([qwen3_gate_logits(weights, config, list(p)).softmax(-1).numpy() for p in prompts])
    got = reference.gate_probs(prompts)
    assert np.abs(got - expected).max() < 1e-5
    # The LoRA delta matters: without it the probabilities move far more than the tolerance.
    base_only = {k: v.float() for k, v in load_file(tiny.model_dir / "model.safetensors").items()}
    base_only["score.weight"] = weights["score.weight"]
    with torch.no_grad():
        unmerged = np.stack([qwen3_gate_logits(base_only, config, list(p)).softmax(-1).numpy() for p in prompts])
    assert np.abs(unmerged - expected).max() > 1e-3


def test_bf16_reference_is_close_to_fp32(tiny: TinyModel, reference: HFReference, tokenizer) -> None:
    prompts = [tokenizer.encode(q + "<|gate|>") for q in QUESTIONS]
    bf16 = HFReference(tiny.model_dir, tiny.adapter_dir, dtype="bfloat16")
    delta = np.abs(bf16.gate_probs(prompts) - reference.gate_probs(prompts)).max()
    assert 0 < delta < 0.05  # bf16 rounding is visible, and small


def test_greedy_generation_is_deterministic_and_honours_ignore_eos(reference: HFReference, tokenizer) -> None:
    prompts = [tokenizer.encode("How long is the warranty?"), tokenizer.encode("Reset")]
    first = reference.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert [len(out) for out in first] == [12, 12]
    assert reference.generate(prompts, max_new_tokens=12, ignore_eos=True) == first
    # Greedy = argmax of the model's own next-token logits, step by step.
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        for _ in range(3):
            ids = torch.cat([ids, reference.lm(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert ids[0, len(prompts[0]):].tolist() == first[0][:3]


def test_gate_returns_a_decision_under_thresholds(reference: HFReference) -> None:
    from gatehead.gate.policy import Thresholds

    docs = [Passage("The warranty covers defects for two years.")]
    result = reference.gate("How long is the warranty?", docs)
    assert set(result.probs) == {"answer", "refuse", "search"}
    assert sum(result.probs.values()) == pytest.approx(1.0)
    assert result.thresholds == reference.adapter.spec.thresholds
    always_search = reference.gate("How long is the warranty?", docs, thresholds=Thresholds(1.0, 1.0))
    assert always_search.decision == "search" and always_search.probs == result.probs


def test_reference_without_adapter_refuses_gate_calls(tiny: TinyModel) -> None:
    with pytest.raises(ValueError, match="without a gate adapter"):
        HFReference(tiny.model_dir).gate_probs([[1, 2, 3]])
    with pytest.raises(ValueError, match="dtype must be"):
        HFReference(tiny.model_dir, dtype="float16")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_merged_gate_reading_the_unmerged_ones_trunk_gives_its_own_logits_exactly(tiny: TinyModel, tokenizer,
                                                                                     dtype: str) -> None:
    from gatehead.gate.reference import Trunk

    prompts = [tokenizer.encode(q + "<|gate|>") for q in QUESTIONS]
    unmerged = HFReference(tiny.model_dir, tiny.adapter_dir, dtype=dtype)
    merged = HFReference(tiny.model_dir, tiny.adapter_dir, dtype=dtype, merged=True)
    trunk = Trunk()
    recorded = unmerged.gate_logits(prompts, trunk)
    assert len(trunk.rows) == len(prompts) and np.array_equal(recorded, unmerged.gate_logits(prompts))
    read = merged.gate_logits(prompts, trunk)
    assert np.array_equal(read, merged.gate_logits(prompts))  # bit for bit, and the layers below come back
    assert len(merged.gate_model.model.layers) == tiny.adapter.spec.base.num_layers
    # It is read at the branch, by the prompt's ids: another stream there gives other logits.
    moved = Trunk()
    moved.rows, moved.source = {key: row * 1.01 for key, row in trunk.rows.items()}, trunk.source
    assert not np.array_equal(merged.gate_logits(prompts, moved), read)
    assert np.array_equal(merged.gate_logits(prompts[::-1], trunk), read[::-1])
    # Another dtype's reference is refused.
    with pytest.raises(ValueError, match="cannot read it"):
        HFReference(tiny.model_dir, tiny.adapter_dir, dtype="float64", merged=True).gate_logits(prompts, trunk)
    assert len(merged.gate_model.model.layers) == tiny.adapter.spec.base.num_layers


def test_a_suffix_mode_gate_takes_no_trunk(tiny_suffix: TinyModel, tokenizer) -> None:
    from gatehead.gate.reference import Trunk

    reference = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir)
    with pytest.raises(ValueError, match="prompt-mode gates only"):
        reference.gate_logits([tokenizer.encode(QUESTIONS[0])], Trunk())
