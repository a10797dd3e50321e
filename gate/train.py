"""Gate training: LoRA on the last k layers plus the 3-way head, on labelled (question, documents) pairs.

Prompts are laid out exactly as the engine lays them out (`gatehead.gate.prompt`), so the adapter
sees at serving time what it saw in training. `activation="suffix"` trains a suffix-mode (activated)
gate: the LoRA adapts only the rows of an invocation suffix of `suffix_length` reserved tokens, and every
earlier row is the base model's (PEFT's aLoRA, offsets passed per batch row). Classes are weighted by
inverse frequency; the epoch with the best validation loss is kept, and training stops after
`patience` epochs without a better one. Everything random is seeded. The result is written in the
adapter format, validated, and only then moved into place. This module
trains; `gatehead.gate.calibrate` sets thresholds afterwards.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gatehead.gate.adapter import (
    ACTIVATIONS,
    DEFAULT_K,
    DEFAULT_SUFFIX,
    BaseIdentity,
    GateAdapter,
    GateSpec,
    alora_offsets,
    lora_config,
    save_gate_adapter,
)
from gatehead.gate.data import Example, gate_prompts
from gatehead.gate.metrics import ClassMetrics, classification_metrics
from gatehead.gate.policy import LABELS
from gatehead.gate.prompt import PromptBuilder, PromptConfig


@dataclass(frozen=True)
class TrainConfig:
    """Gate training settings."""

    k: int = DEFAULT_K
    rank: int = 8
    activation: str = "prompt"  # or "suffix": LoRA on the invocation suffix's rows only
    suffix_length: int = 1  # reserved tokens in the invocation suffix (the suffix token, repeated)
    alpha: float = 16.0
    learning_rate: float = 5e-4
    epochs: int = 10
    batch_size: int = 8
    patience: int = 2  # epochs without a better validation loss before stopping
    seed: int = 0
    max_context: int | None = None  # default: the model's window, at most 4096
    device: str | None = None  # default: cuda if available, else cpu
    progress: bool = True


@dataclass(frozen=True)
class EpochReport:
    epoch: int  # 0: the untrained adapter, before the first step
    train_loss: float | None
    val_loss: float
    val: ClassMetrics


@dataclass(frozen=True)
class TrainResult:
    adapter: GateAdapter
    best_epoch: int
    epochs: list[EpochReport] = field(default_factory=list)  # epochs[i] is epoch i; epochs[0] is untrained

    def to_dict(self) -> dict:
        return {"adapter": str(self.adapter.path), "best_epoch": self.best_epoch,
                "epochs": [asdict(e) for e in self.epochs]}


def train_gate(model_dir: str | Path, train: Sequence[Example], val: Sequence[Example], out_dir: str | Path,
               config: TrainConfig = TrainConfig()) -> TrainResult:
    """Train a gate adapter for the HF causal LM in `model_dir` and write it to `out_dir`."""
    import torch
    from peft import get_peft_model
    from transformers import AutoConfig, AutoTokenizer

    from gatehead.gate.reference import load_classifier

    if config.activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {config.activation!r}")
    if config.suffix_length < 1 or (config.activation == "prompt" and config.suffix_length != 1):
        raise ValueError(f"suffix_length={config.suffix_length}: a suffix-mode gate takes >= 1 suffix tokens, "
                         f"a prompt-mode gate exactly 1")
    model_dir = Path(model_dir)
    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hf_config = AutoConfig.from_pretrained(model_dir)
    window = config.max_context or min(int(hf_config.max_position_embeddings), 4096)
    spec = GateSpec(k=config.k, base=BaseIdentity.of_model(model_dir), suffix=DEFAULT_SUFFIX * config.suffix_length,
                    activation=config.activation)
    builder = PromptBuilder(tokenizer, spec.suffix, PromptConfig(max_context=window, answer_tokens=1))
    invocation = builder.suffix_ids if config.activation == "suffix" else None
    train_xy = (gate_prompts(train, builder), [LABELS.index(e.label) for e in train])
    val_xy = (gate_prompts(val, builder), [LABELS.index(e.label) for e in val])

    base = load_classifier(model_dir)
    base.config.pad_token_id = tokenizer.pad_token_id
    model = get_peft_model(base, lora_config(int(hf_config.num_hidden_layers), config.k, config.rank, config.alpha,
                                             invocation_tokens=invocation))
    model.to(device)
    batches = _Batches(tokenizer.pad_token_id, invocation, config.batch_size, device, random.Random(config.seed))
    best_epoch, reports = _fit(model, batches, train_xy, val_xy, config)
    adapter = save_gate_adapter(model.to("cpu"), spec, out_dir, model_dir)
    result = TrainResult(adapter, best_epoch, reports)
    # The adapter is the directory holding this record: its name, not a path of the training machine.
    record = {**result.to_dict(), "adapter": Path(out_dir).name}
    (Path(out_dir) / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return result


class _Batches:
    """Padded batches of gate prompts (right padding: HF pools the last non-pad token), with the aLoRA
    offsets of a suffix-mode gate; shuffled by one seeded generator across epochs."""

    def __init__(self, pad: int, invocation, batch_size: int, device: str, generator: random.Random) -> None:
        self.pad, self.invocation, self.batch_size, self.device, self.generator = (pad, invocation, batch_size, device,
                                                                                   generator)

    def __call__(self, xs, ys, shuffle: bool):
        import torch

        order = list(range(len(xs)))
        if shuffle:
            self.generator.shuffle(order)
        for i in range(0, len(order), self.batch_size):
            idx = order[i:i + self.batch_size]
            length = max(len(xs[j]) for j in idx)
            ids = torch.full((len(idx), length), self.pad, dtype=torch.long)
            mask = torch.zeros((len(idx), length), dtype=torch.long)
            for row, j in enumerate(idx):
                ids[row, : len(xs[j])] = torch.tensor(xs[j])
                mask[row, : len(xs[j])] = 1
            inputs = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
            if self.invocation is not None:
                inputs["alora_offsets"] = alora_offsets([xs[j] for j in idx], self.invocation, length)
            yield inputs, torch.tensor([ys[j] for j in idx], device=self.device)


def _fit(model, batches: _Batches, train_xy, val_xy, config: TrainConfig) -> tuple[int, list[EpochReport]]:
    """Epochs with class-weighted cross-entropy, validation loss after each, early stop after `patience`
    epochs without a better one; the best epoch's weights are left in `model`. (best epoch, reports)."""
    import torch
    from tqdm import tqdm

    (train_x, train_y), (val_x, val_y) = train_xy, val_xy
    counts = np.bincount(train_y, minlength=len(LABELS)).astype(np.float64)
    weights = torch.tensor(counts.sum() / (len(LABELS) * np.maximum(counts, 1)), dtype=torch.float32,
                           device=batches.device)
    loss_fn = torch.nn.CrossEntropyLoss(weight=weights)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)

    def evaluate() -> tuple[float, np.ndarray]:
        model.eval()
        total, probs = 0.0, []
        with torch.no_grad():
            for inputs, y in batches(val_x, val_y, shuffle=False):
                logits = model(**inputs).logits.float()
                total += loss_fn(logits, y).item() * len(y)
                probs.append(logits.softmax(-1).cpu().numpy())
        return total / len(val_y), np.concatenate(probs)

    val_loss, val_probs = evaluate()
    reports = [EpochReport(0, None, val_loss, classification_metrics(val_y, val_probs.argmax(1).tolist()))]
    best: tuple[float, int, dict] | None = None
    for epoch in range(1, config.epochs + 1):
        model.train()
        total = 0.0
        for inputs, y in tqdm(batches(train_x, train_y, shuffle=True), total=-(-len(train_x) // config.batch_size),
                              desc=f"epoch {epoch}", disable=not config.progress, leave=False):
            loss = loss_fn(model(**inputs).logits.float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
        val_loss, val_probs = evaluate()
        metrics = classification_metrics(val_y, val_probs.argmax(1).tolist())
        reports.append(EpochReport(epoch, total / len(train_y), val_loss, metrics))
        if config.progress:
            print(f"epoch {epoch}: train loss {total / len(train_y):.4f}  val loss {val_loss:.4f}  "
                  f"val accuracy {metrics.accuracy:.3f}")
        if best is None or val_loss < best[0]:
            best = (val_loss, epoch, {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad})
        elif epoch - best[1] >= config.patience:
            break
    assert best is not None
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in best[2]:
                param.copy_(best[2][name])
    return best[1], reports
