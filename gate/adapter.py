"""The gate adapter on disk: a PEFT SEQ_CLS LoRA adapter on the last k layers plus `gate.json`.

Layout of an adapter directory:
- `adapter_config.json`, `adapter_model.safetensors`: a standard PEFT adapter, `task_type=SEQ_CLS`,
  LoRA with `layers_to_transform` inside `[N-k, N)`, `modules_to_save=["score"]` (the 3-way head,
  `Linear(hidden, 3, bias=False)` on the final-normed last token, as HF's `*ForSequenceClassification`);
- `gate.json`: label order, default thresholds, the invocation suffix, the three reserved action
  tokens, `k`, the base model's identity, and the activation: `"prompt"` (LoRA on every row of the
  gate prompt; the default when the field is absent) or `"suffix"` (LoRA on the invocation suffix's
  rows only: PEFT's activated LoRA, `alora_invocation_tokens` = the suffix's token ids, so every
  earlier row is the base model's at every layer and a gate request can read the prefix cache).

Loading validates all of it against a base model directory and names the fix for each problem.
This module does not run models; `gatehead.runtime` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatehead.gate.policy import LABELS, Thresholds
from gatehead.gate.weights import fingerprint, read_headers

GATE_JSON = "gate.json"
FORMAT_VERSION = 1
DEFAULT_K = 4
DEFAULT_SUFFIX = "<|gate|>"
ACTIVATIONS = ("prompt", "suffix")
DEFAULT_ACTION_TOKENS = ("<|gate_answer|>", "<|gate_refuse|>", "<|gate_search|>")
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTER_WEIGHTS = "adapter_model.safetensors"

_LAYER_RE = re.compile(r"\.layers\.(\d+)\.")


class AdapterError(ValueError):
    """A gate adapter that does not fit its base model or the format."""


@dataclass(frozen=True)
class BaseIdentity:
    """Which base model an adapter was trained on."""

    architecture: str
    hidden_size: int
    num_layers: int
    fingerprint: str

    @classmethod
    def of_model(cls, model_dir: str | Path) -> BaseIdentity:
        """Read the identity of the HF checkpoint in `model_dir`."""
        model_dir = Path(model_dir)
        config_file = model_dir / "config.json"
        if not config_file.exists():
            raise AdapterError(f"{model_dir} has no config.json: pass the directory of an HF checkpoint")
        config = json.loads(config_file.read_text())
        text = config.get("text_config", config)
        archs = config.get("architectures") or ["?"]
        return cls(archs[0], int(text["hidden_size"]), int(text["num_hidden_layers"]), fingerprint(model_dir))


@dataclass(frozen=True)
class GateSpec:
    """The contents of `gate.json`."""

    k: int
    base: BaseIdentity
    labels: tuple[str, ...] = LABELS
    thresholds: Thresholds = field(default_factory=Thresholds)
    suffix: str = DEFAULT_SUFFIX
    action_tokens: tuple[str, ...] = DEFAULT_ACTION_TOKENS
    activation: str = "prompt"  # one of ACTIVATIONS

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "labels": list(self.labels),
            "thresholds": self.thresholds.to_dict(),
            "suffix": self.suffix,
            "action_tokens": list(self.action_tokens),
            "activation": self.activation,
            "k": self.k,
            "base": {
                "architecture": self.base.architecture,
                "hidden_size": self.base.hidden_size,
                "num_layers": self.base.num_layers,
                "fingerprint": self.base.fingerprint,
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = GATE_JSON) -> GateSpec:
        if data.get("format_version") != FORMAT_VERSION:
            raise AdapterError(f"{where}: format_version {data.get('format_version')!r} is not "
                               f"{FORMAT_VERSION}; re-save the adapter with this gatehead")
        try:
            labels = tuple(data["labels"])
            if sorted(labels) != sorted(LABELS):
                raise AdapterError(f"{where}: labels must be the three {list(LABELS)} (any order, "
                                   f"each once), got {list(labels)}")
            try:
                thresholds = Thresholds.from_dict(data["thresholds"])
            except (ValueError, TypeError) as e:
                raise AdapterError(f"{where}: {e}; thresholds are probabilities, set them in [0, 1]") from e
            base = BaseIdentity(**data["base"])
            spec = cls(k=int(data["k"]), base=base, labels=labels, thresholds=thresholds,
                       suffix=str(data["suffix"]), action_tokens=tuple(data["action_tokens"]),
                       activation=data.get("activation", "prompt"))
        except KeyError as e:
            raise AdapterError(f"{where}: missing field {e}") from e
        if spec.activation not in ACTIVATIONS:
            raise AdapterError(f"{where}: activation {spec.activation!r} is not one of {list(ACTIVATIONS)}: "
                               f"'prompt' adapts every row of the gate prompt, 'suffix' only the invocation suffix")
        if len(spec.action_tokens) != 3 or len(set(spec.action_tokens)) != 3:
            raise AdapterError(f"{where}: action_tokens must be three distinct reserved tokens, "
                               f"got {list(spec.action_tokens)}")
        if not 1 <= spec.k < spec.base.num_layers:
            raise AdapterError(f"{where}: k={spec.k} must be in [1, {spec.base.num_layers - 1}] for a "
                               f"{spec.base.num_layers}-layer base (at least one layer stays shared)")
        return spec


@dataclass(frozen=True)
class GateAdapter:
    """A validated gate adapter directory."""

    path: Path
    spec: GateSpec
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    layers: tuple[int, ...]  # the layers LoRA touches, all >= branch_layer
    rslora: bool = False
    invocation_tokens: tuple[int, ...] | None = None  # suffix mode: the suffix's token ids (PEFT's aLoRA field)

    @property
    def suffix_mode(self) -> bool:
        """LoRA on the invocation suffix's rows only (`activation: "suffix"`)."""
        return self.spec.activation == "suffix"

    @property
    def branch_layer(self) -> int:
        """Index of the first layer the gate does not share with the base: N - k."""
        return self.spec.base.num_layers - self.spec.k

    @property
    def scaling(self) -> float:
        """The factor of the LoRA delta: x W + (x A) B * scaling."""
        return self.alpha / (self.rank ** 0.5 if self.rslora else self.rank)


def lora_config(num_layers: int, k: int = DEFAULT_K, rank: int = 8, alpha: float = 16.0,
                target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES, dropout: float = 0.0,
                invocation_tokens: Sequence[int] | None = None):
    """The PEFT `LoraConfig` of a gate adapter on the last `k` of `num_layers` layers.

    `invocation_tokens` (the suffix's token ids) makes it a suffix-mode adapter: PEFT's activated LoRA,
    which adapts a row only from the last occurrence of those tokens on. PEFT documents aLoRA for causal
    LMs and warns for other tasks; on a SEQ_CLS model it masks the same Linear layers, and the caller
    passes the offsets (`alora_offsets`), as `gatehead.gate.train` and the HF reference do.
    """
    from peft import LoraConfig, TaskType

    if not 1 <= k < num_layers:
        raise ValueError(f"k={k} must be in [1, {num_layers - 1}] for a {num_layers}-layer model")
    if invocation_tokens is not None and not invocation_tokens:
        raise ValueError("a suffix-mode adapter needs at least one invocation token")
    with quiet_alora():
        return LoraConfig(
            task_type=TaskType.SEQ_CLS,
            r=rank,
            lora_alpha=alpha,
            lora_dropout=dropout,
            target_modules=list(target_modules),
            layers_to_transform=list(range(num_layers - k, num_layers)),
            layers_pattern="layers",
            modules_to_save=["score"],
            bias="none",
            alora_invocation_tokens=None if invocation_tokens is None else [int(t) for t in invocation_tokens],
        )


@contextmanager
def quiet_alora() -> Iterator[None]:
    """PEFT's warning that aLoRA is documented for causal LMs only, silenced (see `lora_config`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*aLoRA.*")
        yield


def alora_offsets(prompts: Sequence[Sequence[int]], invocation_tokens: Sequence[int], length: int) -> list[int]:
    """PEFT's `alora_offsets` for gate prompts that end with `invocation_tokens`, right-padded to `length`.

    An offset counts back from the padded end to the first invocation token: LoRA adapts that row and
    every later one (the padding after a short prompt is adapted too, and masked out by attention and
    pooling). A prompt that does not end with the invocation tokens is an error, never a silent base row.
    """
    invocation = tuple(invocation_tokens)
    offsets = []
    for prompt in prompts:
        if tuple(prompt[len(prompt) - len(invocation):]) != invocation:
            raise ValueError(f"a suffix-mode gate prompt must end with the invocation tokens {list(invocation)}; "
                             f"this one ends with {list(prompt[-len(invocation):])}")
        offsets.append(length - (len(prompt) - len(invocation)))
    return offsets


def load_gate_adapter(adapter_dir: str | Path, base_dir: str | Path, check_tokens: bool = True,
                      tokenizer: Any = None) -> GateAdapter:
    """Load `adapter_dir` and validate it against the base model in `base_dir`.

    `check_tokens=False` skips loading the tokenizer to check the reserved tokens (the engine's
    workers do, after the engine's client has checked them); `tokenizer`, the base's tokenizer where the
    caller has it loaded already.
    """
    adapter_dir, base_dir = Path(adapter_dir), Path(base_dir)
    for name in ("adapter_config.json", ADAPTER_WEIGHTS, GATE_JSON):
        if not (adapter_dir / name).exists():
            raise AdapterError(f"{adapter_dir} has no {name}: a gate adapter directory holds "
                               f"adapter_config.json, {ADAPTER_WEIGHTS} and {GATE_JSON} "
                               f"(write one with gatehead.gate.adapter.save_gate_adapter)")
    try:
        spec = GateSpec.from_dict(json.loads((adapter_dir / GATE_JSON).read_text()), str(adapter_dir / GATE_JSON))
    except json.JSONDecodeError as e:
        raise AdapterError(f"{adapter_dir / GATE_JSON} is not valid JSON: {e}") from e
    _check_base(spec, BaseIdentity.of_model(base_dir), base_dir)
    peft_config = json.loads((adapter_dir / "adapter_config.json").read_text())
    layers = _check_lora(peft_config, adapter_dir, spec)
    invocation = _check_activation(peft_config, adapter_dir, spec)
    _check_head(adapter_dir, spec.base.hidden_size)
    if check_tokens:
        _check_tokens(spec, base_dir, invocation, tokenizer)
    return GateAdapter(
        path=adapter_dir,
        spec=spec,
        rank=int(peft_config["r"]),
        alpha=float(peft_config["lora_alpha"]),
        rslora=bool(peft_config.get("use_rslora")),
        target_modules=tuple(sorted(peft_config["target_modules"])),
        layers=layers,
        invocation_tokens=invocation,
    )


def save_gate_adapter(model: Any, spec: GateSpec, out_dir: str | Path, base_dir: str | Path) -> GateAdapter:
    """Save a PEFT SEQ_CLS `model` with `spec` as a gate adapter; validated before it replaces `out_dir`.

    Nothing is left at `out_dir` if validation fails. PEFT records the base model's path as it was
    loaded (config and model card); the adapter records it relative to itself (`../model`), so that
    no path of the machine it was trained on is kept (gatehead always names the base model when it
    loads an adapter).
    """
    with replace_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        config_path = tmp / "adapter_config.json"
        peft_config = json.loads(config_path.read_text())
        peft_config["base_model_name_or_path"] = os.path.relpath(Path(base_dir).resolve(), Path(out_dir).resolve())
        if isinstance(peft_config.get("target_modules"), list):  # PEFT writes a set in hash order: same bytes always
            peft_config["target_modules"] = sorted(peft_config["target_modules"])
        config_path.write_text(json.dumps(peft_config, indent=2, sort_keys=True) + "\n")
        card = tmp / "README.md"  # PEFT's model card names the base model by the path it was loaded from
        if card.exists():
            base = peft_config["base_model_name_or_path"]
            text = re.sub(r"^base_model: .*$", f"base_model: {base}", card.read_text(), flags=re.M)
            card.write_text(re.sub(r"^- base_model:adapter:.*$", f"- base_model:adapter:{base}", text, flags=re.M))
        (tmp / GATE_JSON).write_text(json.dumps(spec.to_dict(), indent=2) + "\n")
        load_gate_adapter(tmp, base_dir)
    return load_gate_adapter(out_dir, base_dir)


@contextmanager
def replace_dir(out_dir: str | Path, start_from: str | Path | None = None) -> Iterator[Path]:
    """A temporary directory (a copy of `start_from` if given) that replaces `out_dir` only if the block succeeds."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        if start_from is not None:
            shutil.copytree(start_from, tmp, dirs_exist_ok=True)
        yield tmp
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old)
        else:
            tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _check_base(spec: GateSpec, actual: BaseIdentity, base_dir: Path) -> None:
    expected = spec.base
    for field_name in ("architecture", "hidden_size", "num_layers", "fingerprint"):
        want, got = getattr(expected, field_name), getattr(actual, field_name)
        if want != got:
            raise AdapterError(f"wrong base model: the adapter was trained on a base with {field_name}="
                               f"{want!r}, but {base_dir} has {got!r}; load it with the base it was "
                               f"trained on, or retrain it with `gatehead train-gate` on this one")


def _check_lora(peft_config: dict[str, Any], adapter_dir: Path, spec: GateSpec) -> tuple[int, ...]:
    where = adapter_dir / "adapter_config.json"
    if peft_config.get("peft_type") != "LORA" or peft_config.get("task_type") != "SEQ_CLS":
        raise AdapterError(f"{where}: a gate adapter is a LoRA adapter with task_type=SEQ_CLS, got "
                           f"peft_type={peft_config.get('peft_type')!r}, task_type={peft_config.get('task_type')!r}")
    unsupported = [name for name in ("use_dora", "lora_bias", "use_qalora") if peft_config.get(name)]
    unsupported += [name for name in ("rank_pattern", "alpha_pattern") if peft_config.get(name)]
    if unsupported:
        raise AdapterError(f"{where}: {', '.join(unsupported)} set; the gate branch runs plain LoRA "
                           f"(one rank and alpha, no DoRA, no LoRA bias): retrain without them")
    branch = spec.base.num_layers - spec.k
    allowed = f"[{branch}, {spec.base.num_layers - 1}] (the last k={spec.k} layers)"
    declared = peft_config.get("layers_to_transform")
    if declared is None:
        raise AdapterError(f"{where}: layers_to_transform is unset, so LoRA touches every layer; "
                           f"restrict it to {allowed} (gatehead.gate.adapter.lora_config does)")
    declared = [declared] if isinstance(declared, int) else list(declared)
    if any(not branch <= i < spec.base.num_layers for i in declared):
        raise AdapterError(f"{where}: LoRA touches layers {sorted(declared)}, outside {allowed}; "
                           f"layers below N-k must stay the base model's")
    touched = set()
    for h in read_headers(adapter_dir / ADAPTER_WEIGHTS):
        if "lora_" not in h.name:
            continue
        match = _LAYER_RE.search(h.name)
        if match is None or not branch <= int(match.group(1)) < spec.base.num_layers:
            raise AdapterError(f"{adapter_dir / ADAPTER_WEIGHTS}: LoRA weight {h.name} lies outside "
                               f"the layers {allowed}; retrain with LoRA on those layers only")
        touched.add(int(match.group(1)))
    if not touched:
        raise AdapterError(f"{adapter_dir / ADAPTER_WEIGHTS} holds no LoRA weights")
    saved = set(peft_config.get("modules_to_save") or [])
    if "score" not in saved:
        raise AdapterError(f"{where}: modules_to_save lacks 'score': the gate head must be saved "
                           f"with the adapter (modules_to_save=['score'])")
    # PEFT adds "classifier" to SEQ_CLS adapters by itself; the base models here have none.
    others = saved - {"score", "classifier"}
    targets = peft_config.get("target_modules") or []
    unknown = sorted(set([targets] if isinstance(targets, str) else targets) - set(DEFAULT_TARGET_MODULES))
    if others or unknown:
        raise AdapterError(f"{where}: the gate branch applies LoRA to {list(DEFAULT_TARGET_MODULES)} and saves "
                           f"only the head; this adapter also has {sorted(others) + unknown}: retrain without them")
    return tuple(sorted(touched))


def _check_activation(peft_config: dict[str, Any], adapter_dir: Path, spec: GateSpec) -> tuple[int, ...] | None:
    where = adapter_dir / "adapter_config.json"
    invocation = peft_config.get("alora_invocation_tokens")
    if spec.activation == "prompt" and invocation:
        raise AdapterError(f"{where} sets alora_invocation_tokens (LoRA only from the invocation suffix on), but "
                           f"{GATE_JSON} says activation 'prompt': set \"activation\": \"suffix\" in {GATE_JSON}, "
                           f"or retrain without alora_invocation_tokens")
    if spec.activation == "suffix":
        if not invocation:
            raise AdapterError(f"{GATE_JSON} says activation 'suffix', but {where} has no alora_invocation_tokens: "
                               f"set them to the token ids of the suffix {spec.suffix!r} (as gatehead.gate.adapter."
                               f"lora_config does), or set \"activation\": \"prompt\"")
        if not isinstance(invocation, list) or not all(isinstance(t, int) and t >= 0 for t in invocation):
            raise AdapterError(f"{where}: alora_invocation_tokens must be a list of token ids, got {invocation!r}")
        return tuple(invocation)
    return None


def _check_head(adapter_dir: Path, hidden_size: int) -> None:
    heads = {h.name: h for h in read_headers(adapter_dir / ADAPTER_WEIGHTS) if ".score." in f".{h.name}"}
    weights = [h for name, h in heads.items() if name.endswith("score.weight")]
    if not weights:
        raise AdapterError(f"{adapter_dir / ADAPTER_WEIGHTS} has no gate head (score.weight): save the "
                           f"adapter with modules_to_save=['score'] after training the head")
    if any(name.endswith("score.bias") for name in heads):
        raise AdapterError(f"{adapter_dir / ADAPTER_WEIGHTS}: the gate head has a bias; it must be "
                           f"Linear(hidden, 3, bias=False) as HF's *ForSequenceClassification head")
    if weights[0].shape != (3, hidden_size):
        raise AdapterError(f"{adapter_dir / ADAPTER_WEIGHTS}: gate head has shape {list(weights[0].shape)}, "
                           f"expected [3, {hidden_size}] (three labels x the base's hidden size)")


def _check_tokens(spec: GateSpec, base_dir: Path, invocation: tuple[int, ...] | None = None,
                  tokenizer: Any = None) -> None:
    from transformers import AutoTokenizer

    from gatehead.gate.prompt import reserved_token_id

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(base_dir)
    suffix_ids = tokenizer.encode(spec.suffix, add_special_tokens=False)
    special = set(tokenizer.all_special_ids)
    if not suffix_ids or suffix_ids[-1] not in special:
        raise AdapterError(f"gate.json: the invocation suffix {spec.suffix!r} must end with a reserved "
                           f"special token of the base tokenizer, so untrusted text can never produce it")
    if spec.activation == "suffix":
        if any(t not in special for t in suffix_ids):
            raise AdapterError(f"gate.json: a suffix-mode invocation suffix is the rows the LoRA adapts, so every "
                               f"token of it must be a reserved special token; {spec.suffix!r} encodes to "
                               f"{suffix_ids}, of which {[t for t in suffix_ids if t not in special]} are not")
        if invocation is not None and tuple(suffix_ids) != invocation:
            raise AdapterError(f"adapter_config.json: alora_invocation_tokens {list(invocation)} are not the token ids "
                               f"of the suffix {spec.suffix!r} ({suffix_ids}) under this base's tokenizer: "
                               f"retrain the adapter with this tokenizer")
    vocab = json.loads((base_dir / "config.json").read_text())
    vocab_size = vocab.get("text_config", vocab)["vocab_size"]
    for token in spec.action_tokens:
        try:
            token_id = reserved_token_id(tokenizer, token)
        except ValueError as e:
            raise AdapterError(f"gate.json: action token {token!r}: {e}") from e
        if token_id >= vocab_size:
            raise AdapterError(f"gate.json: action token {token!r} has id {token_id}, outside the model's "
                               f"{vocab_size} output rows")
