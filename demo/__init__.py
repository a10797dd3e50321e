"""The demo kit: a small trained model, its gate adapter and a corpus that run out of the box."""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
MODEL_DIR = DEMO_DIR / "model"
ADAPTER_DIR = DEMO_DIR / "adapter"
SUFFIX_ADAPTER_DIR = DEMO_DIR / "adapter-suffix"  # the same gate task as a suffix-mode (activated) gate
