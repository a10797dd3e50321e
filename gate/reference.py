"""The HF transformers reference: ground truth for the shared engine's generations and gate probabilities.

Generation: the base model as `AutoModelForCausalLM`, greedy, one prompt at a time (no padding, so
nothing but the model's own arithmetic decides a token). Gate: `AutoModelForSequenceClassification`
+ `PeftModel` with the adapter unmerged, the head on the last token (a suffix-mode adapter is PEFT's
activated LoRA: the offset of its invocation suffix is passed, so only the suffix rows are adapted);
or, with `merged=True` (prompt mode only), the gate as the dedicated gate engine holds it
(`gatehead.runtime.dedicated`: LoRA merged in fp32, the merged weights in `dtype`, the head in fp32).
Either in fp32 or bf16, on CPU or CUDA. It is slow by design and is not a serving path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from gatehead.gate.adapter import GateAdapter, alora_offsets, load_gate_adapter, quiet_alora
from gatehead.gate.metrics import softmax
from gatehead.gate.policy import LABELS, GateResult, Thresholds, gate_result
from gatehead.gate.prompt import Passage, PromptBuilder, PromptConfig, Turn

Dtype = Literal["float32", "bfloat16", "float64"]  # float64: the yardstick of fp32's own rounding


def load_classifier(model_dir: str | Path, labels: Sequence[str] = LABELS, dtype: Dtype = "float32"):
    """The base checkpoint as an HF `*ForSequenceClassification` with a fresh 3-way head (to be replaced)."""
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialised head": by design, an adapter or training brings it
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)),
            label2id={label: i for i, label in enumerate(labels)}, dtype=getattr(torch, dtype))
    finally:
        hf_logging.set_verbosity(verbosity)


def merged_gate_classifier(model_dir: str | Path, adapter: GateAdapter, dtype: Dtype = "float32"):
    """The gate as one HF classifier: the LoRA merged into the base in fp32, then cast to `dtype`.

    The head stays fp32: the adapter's head is fp32, and vLLM's pooling runner computes it in fp32.
    """
    import torch
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_classifier(model_dir, adapter.spec.labels), adapter.path)
    model = model.merge_and_unload().to(getattr(torch, dtype))
    model.score.to(torch.float32)
    return model


class Trunk:
    """The residual stream entering the gate's branch layer (N - k), per prompt (by its token ids), as one
    prompt-mode reference computed it; another reads it instead of computing layers 0..N-k-1 again. Exact
    where both hold those layers as the same weights in the same dtype: the gate unmerged and with its LoRA
    merged (LoRA touches layers >= N - k only; the merge is made in fp32 and cast, so the layers below keep
    the checkpoint's weights in that dtype). The agreement's HF references use it (`evals.agreement`): their
    merged pass costs k of N layers. It holds every prompt's stream ([tokens, hidden] in the dtype: 4.7 MB
    for 2,048 tokens of the demo model in fp32) until it is dropped."""

    def __init__(self) -> None:
        self.rows: dict[tuple[int, ...], object] = {}
        self.source: tuple | None = None

    def check(self, reference: HFReference) -> None:
        """ValueError unless `reference` may record or read this trunk: a prompt-mode gate of the model,
        adapter and dtype that recorded it, whose decoder layers all attend alike (a model mixing sliding-window
        and full layers picks each layer's mask by its position in the loop, which the tail would shift)."""
        adapter = reference._require_adapter()
        if adapter.suffix_mode:
            raise ValueError("a trunk is recorded and read by prompt-mode gates only")
        kinds = set(getattr(reference.gate_model.config, "layer_types", None) or ())
        if len(kinds) > 1:
            raise ValueError(f"the model mixes layer types {sorted(kinds)}: a trunk cannot be read past them")
        source = (str(reference.model_dir), str(adapter.path), reference.dtype)
        if self.source is not None and self.source != source:
            raise ValueError(f"this trunk was recorded by {self.source}: {source} cannot read it")
        self.source = source

    @contextlib.contextmanager
    def around(self, reference: HFReference, prompt: Sequence[int]) -> Iterator[None]:
        """Record `prompt`'s stream at the branch layer where it was not recorded, else read it there with the
        layers below left out."""
        import torch

        base, key = reference.gate_model, tuple(prompt)
        decoder = (base.get_base_model() if hasattr(base, "get_base_model") else base).model
        layers, branch = decoder.layers, reference._require_adapter().branch_layer
        if key not in self.rows:
            handle = layers[branch].register_forward_pre_hook(
                lambda _, args: self.rows.__setitem__(key, args[0].clone()))
            try:
                yield
            finally:
                handle.remove()
            return
        handle = layers[branch].register_forward_pre_hook(lambda _, args: (self.rows[key], *args[1:]))
        decoder.layers = torch.nn.ModuleList(list(layers)[branch:])
        try:
            yield
        finally:
            handle.remove()
            decoder.layers = layers


class HFReference:
    """A base model and (optionally) its gate adapter, loaded lazily through transformers."""

    def __init__(self, model_dir: str | Path, adapter_dir: str | Path | None = None,
                 dtype: Dtype = "float32", device: str = "cpu", merged: bool = False) -> None:
        if dtype not in ("float32", "bfloat16", "float64"):
            raise ValueError(f"dtype must be 'float32', 'bfloat16' or 'float64', got {dtype!r}")
        self.model_dir = Path(model_dir)
        self.adapter: GateAdapter | None = (
            load_gate_adapter(adapter_dir, self.model_dir) if adapter_dir is not None else None)
        if merged and self.adapter is not None and self.adapter.suffix_mode:
            raise ValueError(f"{adapter_dir} is a suffix-mode gate: activated LoRA adapts the suffix rows only and "
                             f"cannot be merged into the weights; use merged=False")
        self.dtype = dtype
        self.device = device
        self.merged = merged
        self._lm = None
        self._gate = None
        self._tokenizer = None

    def _torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        return self._tokenizer

    @property
    def lm(self):
        if self._lm is None:
            from transformers import AutoModelForCausalLM

            self._lm = AutoModelForCausalLM.from_pretrained(
                self.model_dir, dtype=self._torch_dtype()).to(self.device).eval()
        return self._lm

    def _require_adapter(self) -> GateAdapter:
        if self.adapter is None:
            raise ValueError("this reference was built without a gate adapter: pass adapter_dir")
        return self.adapter

    @property
    def gate_model(self):
        self._require_adapter()
        if self._gate is None:
            from peft import PeftModel

            if not self.merged:
                base = load_classifier(self.model_dir, self.adapter.spec.labels, self.dtype)
                with quiet_alora():
                    model = PeftModel.from_pretrained(base, self.adapter.path)
                self._gate = model.to(device=self.device, dtype=self._torch_dtype()).eval()
            else:
                model = merged_gate_classifier(self.model_dir, self.adapter, self.dtype).to(self.device)
                model.score.register_forward_pre_hook(lambda _, args: (args[0].float(),))  # fp32 head
                self._gate = model.eval()
        return self._gate

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                 ignore_eos: bool = False) -> list[list[int]]:
        """Greedy continuations (token ids, prompt excluded) of each prompt."""
        import torch

        outputs = []
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], device=self.device)
            with torch.inference_mode():
                out = self.lm.generate(
                    ids, attention_mask=torch.ones_like(ids), do_sample=False,
                    max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens if ignore_eos else 0,
                    pad_token_id=self.lm.config.pad_token_id, temperature=None, top_p=None, top_k=None)
            outputs.append(out[0, ids.shape[1]:].tolist())
        return outputs

    def gate_logits(self, prompts: Sequence[Sequence[int]], trunk: Trunk | None = None) -> np.ndarray:
        """Head logits [n, 3] (fp64, exact for every dtype), columns in the adapter's label order. With `trunk`
        (prompt mode): each prompt's residual stream entering the branch layer is recorded there, or, where the
        trunk holds it already, read instead of computing the layers below (`Trunk` says when that is exact)."""
        import torch

        adapter = self._require_adapter()
        if trunk is not None:
            trunk.check(self)
        rows = []
        for prompt in prompts:
            ids = torch.tensor([list(prompt)], device=self.device)
            extra = {}
            if adapter.suffix_mode:
                extra["alora_offsets"] = alora_offsets([prompt], adapter.invocation_tokens, len(prompt))
            with torch.inference_mode(), trunk.around(self, prompt) if trunk is not None else contextlib.nullcontext():
                logits = self.gate_model(input_ids=ids, **extra).logits  # [1, 3]; HF pools the last token
            rows.append(logits[0].double().cpu().numpy())  # exact for bf16 and fp32 logits
        return np.stack(rows) if rows else np.zeros((0, len(LABELS)), dtype=np.float32)

    def gate_probs(self, prompts: Sequence[Sequence[int]], trunk: Trunk | None = None) -> np.ndarray:
        """Probabilities [n, 3] in the canonical label order ("answer", "refuse", "search")."""
        adapter = self._require_adapter()
        probs = softmax(self.gate_logits(prompts, trunk).astype(np.float64))
        order = [adapter.spec.labels.index(label) for label in LABELS]
        return probs[:, order]

    def gate(self, question: str, passages: Sequence[Passage] = (), conversation: Sequence[Turn] = (),
             thresholds: Thresholds | None = None, prompt_config: PromptConfig | None = None) -> GateResult:
        """Gate one question over `passages`, laid out as the shared engine lays it out."""
        adapter = self._require_adapter()
        if prompt_config is None:
            prompt_config = PromptConfig(max_context=self.gate_model.config.max_position_embeddings)
        prompt = PromptBuilder(self.tokenizer, adapter.spec.suffix, prompt_config).build(
            question, passages, conversation)
        probs = self.gate_probs([prompt.gate])[0]
        return gate_result(dict(zip(LABELS, probs, strict=True)), thresholds or adapter.spec.thresholds)
