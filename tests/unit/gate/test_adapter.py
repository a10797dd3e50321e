"""Gate adapter format: round trip and every validation error, each naming its fix."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from gatehead.gate.adapter import GATE_JSON, AdapterError, BaseIdentity, load_gate_adapter, save_gate_adapter
from gatehead.gate.reference import HFReference
from gatehead.gate.weights import fingerprint
from gatehead.tiny import TinyModel

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture
def copy_of(tiny: TinyModel, tmp_path: Path) -> Callable[..., Path]:
    """A fresh copy of the tiny adapter, edited by the given functions."""

    def make(*edits: Callable[[Path], None]) -> Path:
        out = tmp_path / "adapter"
        shutil.copytree(tiny.adapter_dir, out)
        for edit in edits:
            edit(out)
        return out

    return make


def edit_json(name: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(adapter_dir: Path) -> None:
        data = json.loads((adapter_dir / name).read_text())
        change(data)
        (adapter_dir / name).write_text(json.dumps(data))

    return edit


def edit_weights(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(adapter_dir: Path) -> None:
        tensors = load_file(adapter_dir / WEIGHTS)
        change(tensors)
        save_file(tensors, adapter_dir / WEIGHTS)

    return edit


def test_loaded_adapter_describes_the_last_k_layers(tiny: TinyModel) -> None:
    adapter = load_gate_adapter(tiny.adapter_dir, tiny.model_dir)
    assert adapter.spec.k == 4 and adapter.branch_layer == 2
    assert adapter.layers == (2, 3, 4, 5)
    assert adapter.spec.labels == ("answer", "refuse", "search")
    assert adapter.scaling == pytest.approx(16.0 / 8)
    assert adapter.spec.base == BaseIdentity.of_model(tiny.model_dir)


def test_round_trip_gives_identical_probabilities(tiny: TinyModel, tmp_path: Path, tokenizer) -> None:
    prompts = [tokenizer.encode("How long is the warranty?<|gate|>"), tokenizer.encode("Reset the router<|gate|>")]
    before = HFReference(tiny.model_dir, tiny.adapter_dir)
    saved = save_gate_adapter(before.gate_model, before.adapter.spec, tmp_path / "resaved", tiny.model_dir)
    after = HFReference(tiny.model_dir, saved.path)
    assert saved.spec == before.adapter.spec
    recorded = json.loads((saved.path / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not Path(recorded).is_absolute() and (saved.path / recorded).resolve() == tiny.model_dir.resolve()
    assert str(tiny.model_dir) not in (saved.path / "README.md").read_text()  # PEFT's model card
    p_before, p_after = before.gate_probs(prompts), after.gate_probs(prompts)
    assert np.array_equal(p_before, p_after)
    assert np.allclose(p_before.sum(axis=1), 1.0)


def test_fingerprint_is_stable_and_tells_weights_apart(tiny: TinyModel, tiny_other: TinyModel) -> None:
    assert fingerprint(tiny.model_dir) == fingerprint(tiny.model_dir)
    assert fingerprint(tiny.model_dir) != fingerprint(tiny_other.model_dir)


def test_wrong_base_model_is_rejected(tiny: TinyModel, tiny_other: TinyModel) -> None:
    with pytest.raises(AdapterError, match="wrong base model.*fingerprint.*train-gate"):
        load_gate_adapter(tiny.adapter_dir, tiny_other.model_dir)


@pytest.mark.parametrize("field,value", [("hidden_size", 256), ("num_layers", 8), ("architecture", "LlamaForCausalLM")])
def test_base_shape_mismatch_names_the_field(copy_of, tiny: TinyModel, field: str, value) -> None:
    adapter_dir = copy_of(edit_json(GATE_JSON, lambda d: d["base"].__setitem__(field, value)))
    with pytest.raises(AdapterError, match=f"wrong base model.*{field}={value!r}"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("layers_to_transform", [1, 2, 3], r"touches layers \[1, 2, 3\], outside \[2, 5\]"),  # below the branch layer
    ("layers_to_transform", None, "touches every layer; restrict it"),
    ("use_dora", True, "use_dora set; the gate branch runs plain LoRA"),
])
def test_lora_the_branch_cannot_run_is_rejected(copy_of, tiny: TinyModel, key: str, value, message: str) -> None:
    adapter_dir = copy_of(edit_json("adapter_config.json", lambda d: d.__setitem__(key, value)))
    with pytest.raises(AdapterError, match=message):
        load_gate_adapter(adapter_dir, tiny.model_dir)


def test_lora_weight_below_branch_layer_is_rejected(copy_of, tiny: TinyModel) -> None:
    def move_to_layer_0(tensors: dict) -> None:
        name = next(n for n in tensors if ".layers.2.self_attn.q_proj.lora_A" in n)
        tensors[name.replace(".layers.2.", ".layers.0.")] = tensors.pop(name)

    with pytest.raises(AdapterError, match=r"layers\.0\..*lies outside the layers \[2, 5\]"):
        load_gate_adapter(copy_of(edit_weights(move_to_layer_0)), tiny.model_dir)


def test_missing_head_is_rejected(copy_of, tiny: TinyModel) -> None:
    def drop_head(tensors: dict) -> None:
        del tensors[next(n for n in tensors if n.endswith("score.weight"))]

    with pytest.raises(AdapterError, match=r"no gate head \(score.weight\).*modules_to_save"):
        load_gate_adapter(copy_of(edit_weights(drop_head)), tiny.model_dir)


def test_head_with_wrong_shape_or_bias_is_rejected(copy_of, tiny: TinyModel) -> None:
    def four_labels(tensors: dict) -> None:
        name = next(n for n in tensors if n.endswith("score.weight"))
        tensors[name] = tensors[name].new_zeros(4, tensors[name].shape[1])

    with pytest.raises(AdapterError, match=r"shape \[4, 128\], expected \[3, 128\]"):
        load_gate_adapter(copy_of(edit_weights(four_labels)), tiny.model_dir)


def test_head_bias_is_rejected(copy_of, tiny: TinyModel) -> None:
    def add_bias(tensors: dict) -> None:
        name = next(n for n in tensors if n.endswith("score.weight"))
        tensors[name.replace("weight", "bias")] = tensors[name][:, 0].clone()

    adapter_dir = copy_of(edit_weights(add_bias))
    with pytest.raises(AdapterError, match="has a bias"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


BAD_LABELS = [["answer", "refuse", "maybe"], ["answer", "refuse"], ["answer", "answer", "search"]]


@pytest.mark.parametrize("labels", BAD_LABELS)
def test_bad_label_set_is_rejected(copy_of, tiny: TinyModel, labels: list[str]) -> None:
    adapter_dir = copy_of(edit_json(GATE_JSON, lambda d: d.__setitem__("labels", labels)))
    with pytest.raises(AdapterError, match="labels must be the three"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


@pytest.mark.parametrize("thresholds", [{"answer": 1.5, "refuse": 0.5}, {"answer": 0.5, "refuse": -0.2}])
def test_thresholds_outside_unit_interval_are_rejected(copy_of, tiny: TinyModel, thresholds: dict) -> None:
    adapter_dir = copy_of(edit_json(GATE_JSON, lambda d: d.__setitem__("thresholds", thresholds)))
    with pytest.raises(AdapterError, match=r"in \[0, 1\].*set them in \[0, 1\]"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


def test_k_must_leave_a_shared_layer(copy_of, tiny: TinyModel) -> None:
    adapter_dir = copy_of(edit_json(GATE_JSON, lambda d: d.__setitem__("k", 6)))
    with pytest.raises(AdapterError, match=r"k=6 must be in \[1, 5\]"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


def test_suffix_must_end_with_a_reserved_token(copy_of, tiny: TinyModel) -> None:
    adapter_dir = copy_of(edit_json(GATE_JSON, lambda d: d.__setitem__("suffix", "Decide:")))
    with pytest.raises(AdapterError, match="must end with a reserved special token"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


def test_action_tokens_must_be_reserved(copy_of, tiny: TinyModel) -> None:
    tokens = ["yes", "no", "<|gate_search|>"]
    adapter_dir = copy_of(edit_json(GATE_JSON, lambda d: d.__setitem__("action_tokens", tokens)))
    with pytest.raises(AdapterError, match="action token 'yes'.*not a single special token"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


@pytest.mark.parametrize("missing", ["gate.json", "adapter_config.json", WEIGHTS])
def test_missing_file_is_named(copy_of, tiny: TinyModel, missing: str) -> None:
    adapter_dir = copy_of(lambda d: (d / missing).unlink())
    with pytest.raises(AdapterError, match=f"has no {missing}"):
        load_gate_adapter(adapter_dir, tiny.model_dir)


def test_failed_save_leaves_nothing_behind(tiny: TinyModel, tiny_other: TinyModel, tmp_path: Path) -> None:
    reference = HFReference(tiny.model_dir, tiny.adapter_dir)
    out = tmp_path / "never"
    with pytest.raises(AdapterError, match="wrong base model"):
        save_gate_adapter(reference.gate_model, reference.adapter.spec, out, tiny_other.model_dir)
    assert list(tmp_path.iterdir()) == []


def test_lora_on_modules_the_branch_does_not_run_is_rejected(copy_of, tiny: TinyModel) -> None:
    adapter_dir = copy_of(edit_json("adapter_config.json", lambda d: d["modules_to_save"].append("norm")))
    with pytest.raises(AdapterError, match=r"also has \['norm'\]"):
        load_gate_adapter(adapter_dir, tiny.model_dir)
    shutil.rmtree(adapter_dir)
    adapter_dir = copy_of(edit_json("adapter_config.json", lambda d: d["target_modules"].append("lm_head")))
    with pytest.raises(AdapterError, match=r"also has \['lm_head'\]"):
        load_gate_adapter(adapter_dir, tiny.model_dir)
