"""Training the demo model from scratch: its tokenizer, a small Qwen3 causal LM, on `gatehead.demo.tasks`.

Loss is next-token loss on the prompt plus, weighted as much, on the assistant's reply (its tokens
and the end-of-turn token); the prompt is laid out by `gatehead.gate.prompt`, exactly as the engine
and the agent will lay it out. Runs on CUDA
when there is one, else on CPU (slowly). The gate adapter is trained afterwards by the general
gate-training path (`gatehead.gate.train`); this module knows nothing of the gate.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gatehead.demo.tasks import LMExample
from gatehead.gate.adapter import DEFAULT_SUFFIX
from gatehead.gate.prompt import PromptBuilder, PromptConfig, encode_untrusted


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a demo model and its tokenizer. The defaults are the first demo model's (8 layers); the
    committed model's recipe (`gatehead.demo.build.demo_recipe`) sets 12 layers of 8 heads of 32 with 4 KV
    heads, one token per digit and a tokenizer trained on the real training split."""

    num_layers: int = 8
    hidden_size: int = 256
    intermediate_size: int = 1024
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 4096  # BPE merges asked for; the demo texts give fewer, and the model pads to 64
    max_position: int = 2048
    # One token per digit, so copying "€354" is copying three common tokens rather than one of a
    # thousand rare number tokens. On in the committed model (docs/demo-model-history.md).
    split_digits: bool = False
    # What the tokenizer is trained on: "all" the training text, synthetic knowledge bases included,
    # or only the "real" labelled training split. With "all", the invented names of the synthetic
    # knowledge bases (seen thousands of times) become single tokens while held-out names are split
    # into pieces ("Maileir" is one token, "Rowan" is R-ow-an), so training never teaches matching a
    # name spelled in several tokens, which is what every held-out question needs.
    tokenizer_corpus: str = "all"

    def __post_init__(self) -> None:
        if self.tokenizer_corpus not in ("all", "real"):
            raise ValueError(f"tokenizer_corpus must be 'all' or 'real', not {self.tokenizer_corpus!r}")


@dataclass(frozen=True)
class LMConfig:
    """Language-model training settings, data included."""

    knowledge_bases: int = 32  # synthetic knowledge bases (`gatehead.demo.tasks`) beside the training split
    epochs: int = 6
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 200
    weight_decay: float = 0.05
    seed: int = 0
    device: str | None = None  # default: cuda if available, else cpu
    max_steps: int | None = None  # stop early (smoke runs)
    # Train for about this many seconds: the step count is fixed from the rate of steps 50-150, before
    # warm-up ends, so the run equals one given that count as max_steps (training.json records it).
    seconds: float | None = None
    # Continue training this model directory (its tokenizer and shape) instead of a new model.
    init_from: str | None = None
    data_seed: int = 0  # seed of the synthetic knowledge bases and of the examples' order
    # Synthetic negatives mostly of the question's product category, as real retrieval gives them
    # (`gatehead.demo.tasks._context`). On in the committed model's stages (docs/demo-model-history.md).
    same_category_negatives: bool = False
    # Synthetic product names of every initial shape held-out names have (`invented_stems(wide=True)`).
    # On in the committed model's last three stages (docs/demo-model-history.md).
    wide_names: bool = False
    # On CPU, compute in bf16 under autocast as on CUDA (faster where the CPU has AMX); fp32 by default.
    cpu_bf16: bool = False
    # People's phrasings: the phrased training split (`demo/data/phrased-train.jsonl`) beside the
    # templated one, and synthetic knowledge bases asked in the training phrasing families too, with
    # out-of-scope messages (`gatehead.demo.questions.phrased_questions`). On in the committed model's last stage.
    phrasings: bool = False

    def __post_init__(self) -> None:
        if self.seconds is not None and self.warmup_steps < 150:
            raise ValueError("LMConfig.seconds needs warmup_steps >= 150: the step count is fixed during warm-up")


def build_demo_tokenizer(out_dir: Path, texts: Iterable[str], spec: ModelSpec):
    from gatehead.gate.tokenizer import build_tokenizer

    return build_tokenizer(out_dir, spec.vocab_size, texts, split_digits=spec.split_digits)


def encode(examples: Sequence[LMExample], tokenizer, max_context: int, processes: int = 1
           ) -> list[tuple[list[int], int]]:
    """(ids, reply start) per example: the answer prompt, then the reply and the end-of-turn token.

    `processes` > 1 encodes chunks in worker processes (the same result, in order).
    """
    if processes > 1 and len(examples) > 1000:
        from concurrent.futures import ProcessPoolExecutor

        size = -(-len(examples) // (4 * processes))
        chunks = [examples[i:i + size] for i in range(0, len(examples), size)]
        with ProcessPoolExecutor(processes) as pool:
            parts = pool.map(encode, chunks, [tokenizer] * len(chunks), [max_context] * len(chunks))
            return [row for part in parts for row in part]
    builders: dict[str, PromptBuilder] = {}
    out = []
    for e in examples:
        if e.system not in builders:
            builders[e.system] = PromptBuilder(tokenizer, DEFAULT_SUFFIX,
                                               PromptConfig(max_context=max_context, system=e.system))
        prompt = builders[e.system].build(e.question, e.passages, e.conversation)
        if prompt.dropped.passages or prompt.dropped.turns:
            raise ValueError(f"a training example overflows {max_context} tokens: {e.question!r}")
        reply = encode_untrusted(tokenizer, e.target) + [tokenizer.eos_token_id]
        out.append((list(prompt.answer) + reply, len(prompt.answer)))
    return out


def new_model(spec: ModelSpec, tokenizer):
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=-(-len(tokenizer) // 64) * 64, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, max_position_embeddings=spec.max_position,
        rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.02,
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3ForCausalLM"])
    return AutoModelForCausalLM.from_config(config)


def _loss(logits, ids, reply, mask):
    """Mean next-token loss over the prompt plus mean loss over the reply.

    The prompt's share teaches copying: names and codes recur between documents and questions, and
    a small model trained on replies alone learns to guess them instead. The reply's share keeps
    the replies (a few tokens of each example) from drowning in the prompt.
    """
    import torch

    token_loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:],
                                                   reduction="none")  # [B, L-1]
    target_reply = reply[:, 1:]
    target_prompt = mask[:, 1:].bool() & ~target_reply
    return token_loss[target_prompt].mean() + token_loss[target_reply].mean()


def _batch(rows: Sequence[tuple[list[int], int]], pad_id: int, device: str):
    """Right-padded ids, the reply's positions and the real tokens' mask, on `device`."""
    import numpy as np
    import torch

    length = max(len(seq) for seq, _ in rows)
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    reply = np.zeros((len(rows), length), dtype=bool)
    mask = np.zeros((len(rows), length), dtype=bool)
    for row, (seq, start) in enumerate(rows):
        ids[row, :len(seq)] = seq
        reply[row, start:len(seq)] = True
        mask[row, :len(seq)] = True
    return tuple(torch.from_numpy(a).to(device, non_blocking=True) for a in (ids, reply, mask))


def _epoch_batches(data: Sequence[tuple[list[int], int]], batch_size: int, r: random.Random) -> list[list[int]]:
    """One epoch's batches of example indices, in a seeded order: length-grouped (sorted within chunks of
    50 batches), so they waste little on padding."""
    order = list(range(len(data)))
    r.shuffle(order)
    chunk = batch_size * 50
    batches = []
    for i in range(0, len(order), chunk):
        part = sorted(order[i:i + chunk], key=lambda j: len(data[j][0]))
        batches += [part[b:b + batch_size] for b in range(0, len(part), batch_size)]
    r.shuffle(batches)
    return batches


def train_lm(model, data: Sequence[tuple[list[int], int]], pad_id: int, config: LMConfig,
             log=print) -> list[dict]:
    """Train `model` in place on encoded examples; returns the loss log (one entry per 100 steps)."""
    import torch

    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(config.seed)
    r = random.Random(config.seed)
    model.to(device).train()
    optimizer = torch.optim.AdamW([{"params": [p for p in model.parameters() if p.dim() >= 2],
                                    "weight_decay": config.weight_decay},  # matrices decay, norms and biases not
                                   {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=config.learning_rate, betas=(0.9, 0.95))
    per_epoch = -(-len(data) // config.batch_size)
    total = per_epoch * config.epochs if config.max_steps is None else min(config.max_steps, per_epoch * config.epochs)

    def lr_at(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" \
        else torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.cpu_bf16)
    step, running, log_rows, started, timed_from = 0, 0.0, [], time.time(), None
    while step < total:
        for idx in _epoch_batches(data, config.batch_size, r):
            if step >= total:
                break
            ids, reply, mask = _batch([data[j] for j in idx], pad_id, device)
            # Right padding under causal attention never reaches a real token, so no attention mask
            # is needed (and without one, attention takes its fused causal kernel).
            with autocast:
                logits = model(input_ids=ids).logits
            loss = _loss(logits, ids, reply, mask)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            running += loss.detach()  # read every 100 steps: a read each step would wait for the GPU
            step += 1
            if config.seconds is not None and step in (50, 150):
                if device == "cuda":
                    torch.cuda.synchronize()
                if step == 50:
                    timed_from = time.time()
                else:  # still warming up: the schedule so far does not depend on the total
                    rate = 100 / (time.time() - timed_from)
                    total = max(151, min(total, int(rate * (config.seconds - (time.time() - started))) + 150))
                    log(f"{rate:.1f} steps/s: {total} steps in all")
            if step % 100 == 0 or step == total:
                mean = running.item() / (step % 100 or 100)
                log_rows.append({"step": step, "loss": mean, "seconds": round(time.time() - started, 1),
                                 "total": total})
                log(f"step {step}/{total}  loss {mean:.4f}  {time.time() - started:.0f}s")
                running = 0.0
    model.eval()
    return log_rows
