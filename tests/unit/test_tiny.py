"""Tiny models: deterministic, in every supported architecture, usable by the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gatehead.gate.reference import HFReference
from gatehead.gate.weights import fingerprint
from gatehead.tiny import RESERVED_TOKENS, TinySpec, build_tiny


def test_build_is_deterministic(tiny, tmp_path: Path) -> None:
    again = build_tiny(tmp_path, TinySpec())
    assert fingerprint(again.model_dir) == fingerprint(tiny.model_dir)
    for name in ("adapter_model.safetensors", "gate.json"):
        assert (again.adapter_dir / name).read_bytes() == (tiny.adapter_dir / name).read_bytes()
    assert (again.model_dir / "tokenizer.json").read_bytes() == (tiny.model_dir / "tokenizer.json").read_bytes()


def test_tokenizer_has_reserved_tokens_and_chat_template(tokenizer) -> None:
    for token in RESERVED_TOKENS:
        assert tokenizer.convert_tokens_to_ids(token) in tokenizer.all_special_ids
    chat = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_other_architectures_build_and_gate(arch: str, tmp_path: Path, tokenizer) -> None:
    spec = TinySpec(arch=arch, num_layers=5, k=2)
    built = build_tiny(tmp_path, spec)
    assert built.adapter.spec.base.architecture == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[arch]
    assert built.adapter.layers == (3, 4)
    probs = HFReference(built.model_dir, built.adapter_dir).gate_probs([tokenizer.encode("warranty?<|gate|>")])
    assert probs.shape == (1, 3) and np.isclose(probs.sum(), 1.0)


def test_unsupported_architecture_is_a_clear_error() -> None:
    supported = r"supported: \['llama', 'qwen2', 'qwen3'\]"
    with pytest.raises(ValueError, match=r"unsupported architecture 'mistral'; " + supported):
        TinySpec(arch="mistral")
    with pytest.raises(ValueError, match=r"k=6 must be in \[1, 5\]"):
        TinySpec(k=6)
