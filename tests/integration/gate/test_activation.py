"""Suffix-mode (activated) gate adapters: the format, its checks, the HF reference, training.

A suffix-mode adapter's LoRA adapts only the rows of its invocation suffix; every earlier row is the
base model's at every layer. The reference (PEFT's activated LoRA with explicit offsets) is checked
against an independent construction of the same thing: the base model's KV cache of the prefix, then
the same LoRA weights applied to every row of the suffix alone, reading that cache.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gatehead.gate.adapter import AdapterError, alora_offsets, load_gate_adapter
from gatehead.gate.calibrate import calibrate
from gatehead.gate.data import read_examples
from gatehead.gate.prompt import Passage, PromptBuilder, PromptConfig
from gatehead.gate.reference import HFReference
from gatehead.gate.train import TrainConfig, train_gate
from gatehead.tiny import TinyModel, TinySpec, build_tiny

GATEHEAD = str(Path(sys.executable).parent / "gatehead")
QUESTIONS = [("How long is the router warranty?", "The router warranty lasts two years."),
             ("Can I return an opened printer?", "Customers can return a product within thirty days."),
             ("What is the premium plan's price?", "Shipping is free for orders above fifty euros."),
             ("How do I reset the router?", "")]


@pytest.fixture(scope="module")
def activated(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A tiny model with a random suffix-mode adapter whose invocation suffix is two reserved tokens."""
    return build_tiny(tmp_path_factory.mktemp("activated"), TinySpec(activation="suffix", suffix_length=2))


@pytest.fixture
def edited(activated: TinyModel, tmp_path: Path) -> Callable[..., Path]:
    def make(name: str, change: Callable[[dict], None]) -> Path:
        out = tmp_path / "adapter"
        shutil.copytree(activated.adapter_dir, out)
        data = json.loads((out / name).read_text())
        change(data)
        (out / name).write_text(json.dumps(data))
        return out

    return make


def question_prompts(model: TinyModel) -> list[tuple[int, ...]]:
    adapter = load_gate_adapter(model.adapter_dir, model.model_dir)
    from transformers import AutoTokenizer

    builder = PromptBuilder(AutoTokenizer.from_pretrained(model.model_dir), adapter.spec.suffix,
                            PromptConfig(max_context=4096))
    return [builder.build(q, [Passage(d)] if d else []).gate for q, d in QUESTIONS]


def test_a_suffix_mode_adapter_records_its_activation_and_invocation(activated: TinyModel) -> None:
    adapter = load_gate_adapter(activated.adapter_dir, activated.model_dir)
    assert adapter.suffix_mode and adapter.spec.suffix == "<|gate|><|gate|>"
    assert json.loads((activated.adapter_dir / "gate.json").read_text())["activation"] == "suffix"
    config = json.loads((activated.adapter_dir / "adapter_config.json").read_text())
    assert config["alora_invocation_tokens"] == list(adapter.invocation_tokens) and len(adapter.invocation_tokens) == 2
    prompts = question_prompts(activated)
    assert all(p[-2:] == adapter.invocation_tokens for p in prompts)


def test_an_adapter_without_the_field_is_prompt_mode(tiny: TinyModel, tmp_path: Path) -> None:
    """Adapters written before the field existed load unchanged, as prompt-mode gates."""
    out = tmp_path / "adapter"
    shutil.copytree(tiny.adapter_dir, out)
    data = json.loads((out / "gate.json").read_text())
    assert data.pop("activation") == "prompt"
    (out / "gate.json").write_text(json.dumps(data))
    adapter = load_gate_adapter(out, tiny.model_dir)
    assert not adapter.suffix_mode and adapter.spec.activation == "prompt" and adapter.invocation_tokens is None


@pytest.mark.parametrize(("name", "change", "message"), [
    ("gate.json", lambda d: d.update(activation="both"), "activation 'both' is not one of"),
    ("gate.json", lambda d: d.update(activation="prompt"), "set \"activation\": \"suffix\""),
    ("adapter_config.json", lambda d: d.update(alora_invocation_tokens=None), "has no alora_invocation_tokens"),
    ("adapter_config.json", lambda d: d.update(alora_invocation_tokens=[3, 4]), "are not the token ids of the suffix"),
    ("adapter_config.json", lambda d: d.update(alora_invocation_tokens="<|gate|>"), "must be a list of token ids"),
    ("gate.json", lambda d: d.update(suffix="gate<|gate|>"), "every token of it must be a reserved special token"),
])
def test_bad_activation_is_rejected_with_the_fix(edited, activated: TinyModel, name, change, message) -> None:
    with pytest.raises(AdapterError, match=message.replace("(", r"\(")):
        load_gate_adapter(edited(name, change), activated.model_dir)


def test_offsets_point_at_the_first_invocation_token() -> None:
    assert alora_offsets([(5, 6, 7, 1, 1), (5, 1, 1)], (1, 1), 5) == [2, 4]
    with pytest.raises(ValueError, match="must end with the invocation tokens"):
        alora_offsets([(5, 1, 6)], (1,), 3)


def test_the_reference_is_the_base_prefix_cache_plus_the_lora_on_the_suffix(activated: TinyModel, tmp_path) -> None:
    """PEFT's activated LoRA (the reference) against an independent construction, in fp32."""
    import torch
    from peft import PeftModel

    from gatehead.gate.reference import load_classifier

    adapter = load_gate_adapter(activated.adapter_dir, activated.model_dir)
    prompts = question_prompts(activated)
    reference = HFReference(activated.model_dir, activated.adapter_dir).gate_logits(prompts)
    # The same weights as a prompt-mode adapter: LoRA on every row it sees.
    plain = tmp_path / "plain"
    shutil.copytree(activated.adapter_dir, plain)
    config = json.loads((plain / "adapter_config.json").read_text())
    config["alora_invocation_tokens"] = None
    (plain / "adapter_config.json").write_text(json.dumps(config))
    base = load_classifier(activated.model_dir, adapter.spec.labels).eval()
    lora = PeftModel.from_pretrained(load_classifier(activated.model_dir, adapter.spec.labels), plain).eval()
    n = len(adapter.invocation_tokens)
    rows = []
    with torch.inference_mode():
        for prompt in prompts:
            prefix, suffix = torch.tensor([prompt[:-n]]), torch.tensor([prompt[-n:]])
            cache = base.model(input_ids=prefix, use_cache=True).past_key_values  # base K/V at every layer
            positions = torch.arange(len(prompt) - n, len(prompt))[None]
            out = lora(input_ids=suffix, past_key_values=cache, position_ids=positions,
                       attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
            rows.append(out.logits[0].numpy())
    by_hand = np.stack(rows)
    assert np.abs(reference - by_hand).max() <= 1e-4, (reference, by_hand)
    # The masking matters: the same weights on every row of the prompt give other logits.
    with torch.inference_mode():
        everywhere = np.stack([lora(input_ids=torch.tensor([p])).logits[0].numpy() for p in prompts])
    assert np.abs(everywhere - reference).max() > 1e-2


def test_suffix_mode_has_no_merged_or_dedicated_form(activated: TinyModel, tmp_path) -> None:
    from gatehead.runtime.dedicated import export_dedicated

    with pytest.raises(ValueError, match="cannot be merged"):
        HFReference(activated.model_dir, activated.adapter_dir, merged=True)
    with pytest.raises(ValueError, match="dedicated engine exists for prompt-mode gates only"):
        export_dedicated(activated.model_dir, activated.adapter_dir, tmp_path / "dedicated")
    assert not (tmp_path / "dedicated").exists()


def test_training_a_suffix_mode_gate_learns_and_the_reference_agrees(tiny: TinyModel, labelled, tmp_path) -> None:
    train, val = read_examples(labelled["train"]), read_examples(labelled["val"])
    config = TrainConfig(epochs=8, learning_rate=2e-3, patience=3, progress=False, activation="suffix",
                         suffix_length=2)
    result = train_gate(tiny.model_dir, train, val, tmp_path / "adapter", config)
    untrained, best = result.epochs[0], result.epochs[result.best_epoch]
    assert result.adapter.suffix_mode and len(result.adapter.invocation_tokens) == 2
    assert best.val_loss < untrained.val_loss and best.val.accuracy > max(untrained.val.accuracy, 0.6), best
    # Unpadded, one prompt at a time, the reference gives the decisions training measured (right-padded batches).
    reference = HFReference(tiny.model_dir, result.adapter.path)
    probs = [reference.gate(e.question, e.passages).probs for e in val]
    accuracy = float(np.mean([max(p, key=p.get) == e.label for p, e in zip(probs, val, strict=True)]))
    assert abs(accuracy - best.val.accuracy) <= 1 / len(val) + 1e-9, (accuracy, best.val.accuracy)
    # Calibration goes through the same reference and keeps the activation.
    report = calibrate(tiny.model_dir, result.adapter.path, val, answer_precision=0.8)
    calibrated = load_gate_adapter(result.adapter.path, tiny.model_dir)
    assert calibrated.suffix_mode and calibrated.spec.thresholds == report.thresholds_after
    assert report.after.accuracy >= 0.6, report


def test_train_gate_command_takes_the_activation(tiny: TinyModel, labelled, tmp_path) -> None:
    out, few = tmp_path / "adapter", tmp_path / "few.jsonl"
    few.write_text("".join(labelled["train"].read_text().splitlines(keepends=True)[:12]))
    result = subprocess.run([GATEHEAD, "train-gate", "--model", str(tiny.model_dir), "--train", str(few),
                             "--val", str(few), "--out", str(out), "--epochs", "1", "--activation",
                             "suffix", "--suffix-length", "3", "--rank", "4", "--k", "2"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    adapter = load_gate_adapter(out, tiny.model_dir)
    assert adapter.suffix_mode and len(adapter.invocation_tokens) == 3 and adapter.rank == 4 and adapter.spec.k == 2
    bad = subprocess.run([GATEHEAD, "train-gate", "--model", str(tiny.model_dir), "--train", str(few),
                          "--val", str(few), "--out", str(tmp_path / "never"), "--suffix-length", "2"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "a prompt-mode gate exactly 1" in bad.stderr, bad.stderr[-2000:]
    assert not (tmp_path / "never").exists()
