"""What tests stand on: tiny random models, and a scripted engine and store for the fast tier.

Tiny random models, for tests and benchmarks: base checkpoint, tokenizer and gate adapter, in seconds.

`build_tiny(out_dir, TinySpec(...))` writes, deterministically for a given spec:
- `model/`: an HF causal-LM checkpoint (Qwen3, Qwen2 or Llama architecture, bf16 safetensors) with a
  byte-level BPE tokenizer trained here (gatehead's reserved tokens included) and a ChatML template;
- `adapter/`: a randomly initialised gate adapter in the real on-disk format (`gatehead.gate.adapter`).

The weights are random: generations are gibberish and gate probabilities are noise. Use it to test
mechanics and numerics, never quality; the demo model is the trained one.

`ScriptedEngine` and `ScriptedStore` stand in for the shared engine and the Qdrant store where the
point is routing and error handling (an agent graph's routes, the service's error paths): the
engine lays prompts out with the real `PromptBuilder` and answers gates as a test scripts them, with
no vLLM; both record every call.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatehead.gate.adapter import (
    DEFAULT_SUFFIX,
    BaseIdentity,
    GateAdapter,
    GateSpec,
    lora_config,
    save_gate_adapter,
)
from gatehead.gate.policy import Thresholds, gate_result
from gatehead.gate.prompt import PromptBuilder, PromptConfig
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


def demo_kit() -> tuple[Path, Path, Path]:
    """(model, prompt-mode gate, suffix-mode gate) of the demo, the model built on first use."""
    from gatehead import demo
    from gatehead.demo.base import ensure_demo_model

    return ensure_demo_model(), demo.ADAPTER_DIR, demo.SUFFIX_ADAPTER_DIR


# ----- the scripted engine and store ------------------------------------------------------------

SCRIPTED_PROBS = {"answer": {"answer": 0.9, "refuse": 0.05, "search": 0.05},
                  "refuse": {"answer": 0.05, "refuse": 0.9, "search": 0.05},
                  "search": {"answer": 0.1, "refuse": 0.1, "search": 0.8}}


@dataclass
class ScriptedEngine:
    """An engine with `SharedEngine`'s interface and no model: gates decide as `decisions` says, in order
    ("answer" when they run out); generations say `rewrite` (whole) or stream `answer` word by word.

    Hooks for failure paths: `fail` (an exception every gate and generation raises), `hold` (an event
    every call waits for first: a request that stays in flight), `cancelled` (calls cancelled while
    held), `gate_seconds` (how long a gate takes: what a stream beside it makes meanwhile). `calls`
    records (method, keyword arguments) of every call; `streamed` the tokens each stream yielded.
    """

    tokenizer: Any
    adapter: Any
    decisions: list[str] = field(default_factory=list)
    answer: str = "The warranty lasts two years [1]."
    rewrite: str = "warranty period of the Vale Lantern"
    max_model_len: int = 1024
    fail: BaseException | None = None
    hold: asyncio.Event | None = None
    calls: list[tuple[str, dict]] = field(default_factory=list)
    cancelled: int = 0
    gate_seconds: float = 0.0
    streamed: list[int] = field(default_factory=list)
    alive: bool = True

    def __post_init__(self) -> None:
        self.prompts: PromptBuilder | None = PromptBuilder(self.tokenizer, self.adapter.spec.suffix,
                                                           PromptConfig(max_context=self.max_model_len))
        self.gate_reserved = frozenset()

    async def _enter(self, method: str, kwargs: dict) -> None:
        self.calls.append((method, kwargs))
        if self.hold is not None:
            try:
                await self.hold.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if self.fail is not None:
            raise self.fail

    async def gate(self, question, passages=(), conversation=(), *, thresholds=None, cache_salt=None):
        from gatehead.runtime.engine import GateOutcome

        prompt = self.prompts.build(question, passages, conversation)
        await self._enter("gate", {"question": question, "passages": len(passages), "cache_salt": cache_salt})
        await asyncio.sleep(self.gate_seconds)
        decision = self.decisions.pop(0) if self.decisions else "answer"
        result = gate_result(SCRIPTED_PROBS[decision], thresholds or Thresholds(0.5, 0.5))
        return GateOutcome(result, prompt, len(prompt.gate), 0)

    async def generate(self, prompt: Sequence[int], **kwargs: Any):
        from gatehead.runtime.engine import Generation

        await self._enter("generate", kwargs)
        return Generation([1, 2], self.rewrite, [0.0, 0.0], "stop", 0)

    async def stream(self, prompt: Sequence[int], **kwargs: Any) -> AsyncIterator[Any]:
        from gatehead.runtime.engine import Generation

        await self._enter("stream", kwargs)
        words = self.answer.split(" ")
        self.streamed.append(0)
        for n in range(1, len(words) + 1):
            await asyncio.sleep(0)  # a step apart, as an engine's outputs come
            self.streamed[-1] = n
            yield Generation(list(range(n)), " ".join(words[:n]), [0.0] * n, "stop" if n == len(words) else None,
                             len(prompt) - 1)

    async def warm_up(self) -> None:
        await self._enter("warm_up", {})

    def check_length(self, ids: Sequence[int], max_tokens: int) -> None:
        from gatehead.runtime.engine import SharedEngine

        SharedEngine.check_length(self, ids, max_tokens)  # the engine's own check, on this max_model_len

    async def stats(self) -> dict[str, float]:
        return {"running": 0, "waiting": 0}

    def shutdown(self) -> None:
        self.alive = False


class ScriptedStore:
    """A retriever of one fixed document; `fail` makes every search raise. `queries` records the searches."""

    DOCUMENT = {"text": "The Vale Lantern has a 2-year warranty.", "title": "Vale Lantern", "source": "vale.md"}

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.queries, self.closed = fail, [], False

    def search(self, query: str, top_k: int = 3) -> list[dict]:
        self.queries.append(query)
        if self.fail:
            raise ConnectionError("the store went away")
        return [self.DOCUMENT][:top_k]

    def ping(self) -> None:
        if self.fail:
            raise ConnectionError("the store went away")

    def close(self) -> None:
        self.closed = True


def cited(answer: str, sources: Sequence[str], dropped: Sequence[str] = ()) -> list[str]:
    """The sources an answer's `[n]` markers point at: the prompt numbers the passages it kept from 1, in order
    (`dropped`: the sources, or indices, the context budget left out). A marker past them stays "[n]?".

    What a test of a trained model checks instead of the model's exact words: the fact, and where it
    says the fact came from."""
    kept = [s for i, s in enumerate(sources) if s not in dropped and str(i) not in dropped]
    return [kept[int(n) - 1] if 0 < int(n) <= len(kept) else f"[{n}]?" for n in re.findall(r"\[(\d+)\]", answer)]


def states(answer: str, fact: str) -> bool:
    """`fact` appears in `answer` as a whole: "€64" is in "costs €64 [1]", not in "€640"."""
    return re.search(rf"(?<![\w]){re.escape(fact)}(?![\w])", answer) is not None
