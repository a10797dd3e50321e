"""Weights counted as the engines hold them: a checkpoint's bytes as stored, or in the dtype it is loaded in."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from gatehead.evals.kv import checkpoint_bytes


def test_checkpoints_stored_in_different_dtypes_count_alike_in_the_engines_dtype(tmp_path: Path) -> None:
    tensors = {"w": torch.zeros(3, 5), "positions": torch.zeros(7, dtype=torch.int64)}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        (tmp_path / name).mkdir()
        save_file({"w": tensors["w"].to(dtype), "positions": tensors["positions"]},
                  str(tmp_path / name / "model.safetensors"))
    assert checkpoint_bytes(tmp_path / "fp32") == 15 * 4 + 7 * 8
    assert checkpoint_bytes(tmp_path / "bf16") == 15 * 2 + 7 * 8
    for dtype, width in (("bfloat16", 2), ("float32", 4)):  # integer tensors keep their width
        as_loaded = 15 * width + 7 * 8
        assert checkpoint_bytes(tmp_path / "fp32", dtype) == checkpoint_bytes(tmp_path / "bf16", dtype) == as_loaded
