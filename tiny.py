"""Tiny random models, for tests and benchmarks: base checkpoint, tokenizer and gate adapter, in seconds.

`build_tiny(out_dir, TinySpec(...))` writes, deterministically for a given spec:
- `model/`: an HF causal-LM checkpoint (Qwen3, Qwen2 or Llama architecture, bf16 safetensors) with a
  byte-level BPE tokenizer trained here (gatehead's reserved tokens included) and a ChatML template;
- `adapter/`: a randomly initialised gate adapter in the real on-disk format (`gatehead.gate.adapter`).

The weights are random: generations are gibberish and gate probabilities are noise. Use it to test
mechanics and numerics, never quality; the demo model is the trained one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gatehead.gate.adapter import (
    DEFAULT_SUFFIX,
    BaseIdentity,
    GateAdapter,
    GateSpec,
    lora_config,
    save_gate_adapter,
)
from gatehead.gate.tokenizer import RESERVED_TOKENS, build_tokenizer  # noqa: F401 - RESERVED_TOKENS for tests

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
# The tokenizer's training text: deterministic, and close enough to RAG prompts that they tokenize compactly.
_CORPUS = """\
The warranty covers defects in materials and workmanship for two years from the date of purchase.
Customers can return a product within thirty days if it is unused and in its original packaging.
To reset the router, hold the reset button for ten seconds until the light blinks orange.
Our support team answers questions by email and by phone from Monday to Friday.
Shipping is free for orders above fifty euros; express delivery takes one business day.
The battery lasts about twelve hours of normal use and charges fully in two hours.
Which documents answer the question? If the documents do not contain the answer, say so.
You are a helpful assistant. Answer the question using only the documents below.
What is the price of the premium plan, and how do I cancel my subscription?
Passwords must have at least twelve characters, one number and one symbol.
"""


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny model; the defaults make a 6-layer, 64-wide Qwen3 that builds in seconds."""

    arch: str = "qwen3"
    num_layers: int = 6
    hidden_size: int = 128
    intermediate_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention supports head_dim >= 32
    tokenizer_vocab: int = 384  # BPE vocabulary trained on _CORPUS (reserved tokens included)
    max_position: int = 4096
    initializer_range: float = 0.1  # large enough that greedy generations vary with the prompt
    k: int = 4
    activation: str = "prompt"  # "suffix": an activated gate adapter (LoRA on the suffix rows only)
    suffix_length: int = 1  # tokens of the invocation suffix (the suffix token, repeated)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_std: float = 0.05  # LoRA A and B ~ N(0, std): a visible, not overwhelming delta
    head_std: float = 0.25  # spreads gate probabilities over the three classes
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"unsupported architecture {self.arch!r}; supported: {sorted(ARCHITECTURES)}")
        if not 1 <= self.k < self.num_layers:
            raise ValueError(f"k={self.k} must be in [1, {self.num_layers - 1}]")


@dataclass(frozen=True)
class TinyModel:
    """Paths of a built tiny model."""

    model_dir: Path
    adapter_dir: Path
    adapter: GateAdapter


def _config(spec: TinySpec, vocab_size: int, tokenizer):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position,
        initializer_range=spec.initializer_range, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, architectures=[ARCHITECTURES[spec.arch]],
    )
    if spec.arch == "qwen3":
        return Qwen3Config(head_dim=spec.head_dim, **common)
    if spec.arch == "llama":
        return LlamaConfig(head_dim=spec.head_dim, **common)
    if spec.hidden_size != spec.num_heads * spec.head_dim:
        raise ValueError("qwen2 derives head_dim = hidden_size / num_heads; make them agree")
    return Qwen2Config(**common)


def _centred_head(model, tokenizer, spec: TinySpec, generator):
    """A random head [3, hidden] orthogonal to the mean final state of gate prompts.

    A random model's final states share one large direction (the suffix token's); a random head
    read along it sends every prompt to the same class. Removing it lets decisions vary with the prompt.
    """
    import torch

    from gatehead.gate.prompt import Passage, PromptBuilder, PromptConfig

    builder = PromptBuilder(tokenizer, DEFAULT_SUFFIX, PromptConfig(max_context=spec.max_position))
    lines = _CORPUS.splitlines()
    prompts = [builder.build(q, [Passage(p)]).gate for q, p in zip(lines, lines[3:] + lines[:3], strict=True)]
    decoder = model.base_model.model.model  # PEFT wrapper -> LoRA model -> *ForSequenceClassification -> decoder
    states = torch.stack([decoder(input_ids=torch.tensor([p])).last_hidden_state[0, -1] for p in prompts])
    mean = states.mean(0)
    head = torch.randn(3, spec.hidden_size, generator=generator) * spec.head_std
    return head - (head @ mean)[:, None] * mean[None, :] / (mean @ mean)


def build_tiny(out_dir: str | Path, spec: TinySpec = TinySpec()) -> TinyModel:
    """Build the tiny model and its random gate adapter under `out_dir` (see the module docstring)."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from gatehead.gate.reference import load_classifier

    out_dir = Path(out_dir)
    model_dir, adapter_dir = out_dir / "model", out_dir / "adapter"
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(model_dir, spec.tokenizer_vocab, _CORPUS.splitlines())
    vocab_size = -(-len(tokenizer) // 64) * 64  # padded like real checkpoints: rows past the tokenizer exist

    torch.manual_seed(spec.seed)
    base = AutoModelForCausalLM.from_config(_config(spec, vocab_size, tokenizer), dtype=torch.float32)
    base.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)

    suffix = DEFAULT_SUFFIX * spec.suffix_length
    invocation = tokenizer.encode(suffix, add_special_tokens=False) if spec.activation == "suffix" else None
    lora = lora_config(spec.num_layers, spec.k, spec.lora_rank, spec.lora_alpha, invocation_tokens=invocation)
    model = get_peft_model(load_classifier(model_dir), lora)
    generator = torch.Generator().manual_seed(spec.seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * spec.lora_std)
        head = next(p for n, p in model.named_parameters() if "score" in n and p.requires_grad)
        head.copy_(_centred_head(model, tokenizer, spec, generator))
    gate_spec = GateSpec(k=spec.k, base=BaseIdentity.of_model(model_dir), suffix=suffix, activation=spec.activation)
    adapter = save_gate_adapter(model, gate_spec, adapter_dir, model_dir)
    return TinyModel(model_dir=model_dir, adapter_dir=adapter_dir, adapter=adapter)
