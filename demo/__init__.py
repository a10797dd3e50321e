"""The demo kit: a small trained model, its gate adapters and a corpus that run out of the box, and the
pretrained model that is to replace it (a registry base with the committed generator merged at setup)."""

import os
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent


def cache_root() -> Path:
    """`$GATEHEAD_CACHE`, else `.cache/` of the checkout the demo kit lives in."""
    return Path(os.environ.get("GATEHEAD_CACHE") or DEMO_DIR.parent / ".cache")


MODEL_DIR = DEMO_DIR / "model"  # the 12.8 M model trained from scratch (docs/demo-model-history.md)
ADAPTER_DIR = DEMO_DIR / "adapter"
SUFFIX_ADAPTER_DIR = DEMO_DIR / "adapter-suffix"  # the same gate task as a suffix-mode (activated) gate
# The demo model on a pretrained base, not yet the default: SmolLM2-135M-Instruct (`gatehead.demo.base`) with
# the committed generator merged in (`gatehead.demo.finetune.ensure_demo_model`), built under the cache by
# `make base`, and its two gates (docs/demo-model.md).
PRETRAINED_DIR = cache_root() / "demo-model"
PRETRAINED_ADAPTER_DIR = DEMO_DIR / "smollm2" / "adapter"
PRETRAINED_SUFFIX_ADAPTER_DIR = DEMO_DIR / "smollm2" / "adapter-suffix"
