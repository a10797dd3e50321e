"""The dedicated gate engine's checkpoint: the gate model merged into an HF `*ForSequenceClassification`.

Stock vLLM serves the result with its pooling runner (`LLM(..., runner="pooling").classify(...)`):
no gatehead code runs in it, which is what makes it the honest comparison for the shared engine's
gate. The LoRA delta is merged in fp32 and the merged weights are saved in `dtype`.
This module writes checkpoints; it does not start engines.
"""

from __future__ import annotations

import json
from pathlib import Path

from gatehead.gate.adapter import load_gate_adapter, replace_dir
from gatehead.gate.reference import merged_gate_classifier

CLASSIFIER_ARCHITECTURES = {
    "Qwen3ForCausalLM": "Qwen3ForSequenceClassification",
    "Qwen2ForCausalLM": "Qwen2ForSequenceClassification",
    "LlamaForCausalLM": "LlamaForSequenceClassification",
}


def export_dedicated(model_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path,
                     dtype: str = "bfloat16", max_shard_size: str = "2GB") -> Path:
    """Write the merged gate classifier to `out_dir` (replaced only once complete)."""
    from transformers import AutoTokenizer

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    adapter = load_gate_adapter(adapter_dir, model_dir)
    if adapter.suffix_mode:
        raise ValueError(f"{adapter_dir} is a suffix-mode (activated) gate: its LoRA adapts the suffix rows only, "
                         f"which no merged classifier can hold, and stock vLLM refuses activated LoRA; a "
                         f"dedicated engine exists for prompt-mode gates only")
    if adapter.spec.base.architecture not in CLASSIFIER_ARCHITECTURES:
        raise ValueError(f"no dedicated classifier for {adapter.spec.base.architecture}; "
                         f"supported: {sorted(CLASSIFIER_ARCHITECTURES)}")
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype must be 'bfloat16' or 'float32', got {dtype!r}")
    merged = merged_gate_classifier(model_dir, adapter, dtype)
    merged.config.architectures = [CLASSIFIER_ARCHITECTURES[adapter.spec.base.architecture]]

    with replace_dir(out_dir) as tmp:
        merged.save_pretrained(tmp, safe_serialization=True, max_shard_size=max_shard_size)
        AutoTokenizer.from_pretrained(model_dir).save_pretrained(tmp)
        (tmp / "gatehead_dedicated.json").write_text(json.dumps(
            {"base_fingerprint": adapter.spec.base.fingerprint, "adapter": str(adapter.path),
             "labels": list(adapter.spec.labels), "thresholds": adapter.spec.thresholds.to_dict()}, indent=2) + "\n")
    return out_dir
