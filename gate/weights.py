"""Reading safetensors checkpoints without loading them: tensor headers and a weights fingerprint.

The fingerprint identifies a base model's weights cheaply enough to check on every adapter
load, even at 27B: it hashes every tensor's name, dtype and shape plus the first
`FINGERPRINT_BYTES` of its data, read straight from the files. Any fine-tune or different
checkpoint changes those bytes; re-saving the same weights in the same dtype does not.
It does not prove two checkpoints equal bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

FINGERPRINT_BYTES = 16384


@dataclass(frozen=True)
class TensorHeader:
    """Where one tensor lies in a safetensors file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offset of the data in `file`
    end: int


def read_headers(file: Path) -> list[TensorHeader]:
    """The tensor headers of one safetensors file."""
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{file} is not a safetensors file (shorter than its header)")
        (length,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{file} is not a safetensors file ({e})") from e
    base = 8 + length
    return [
        TensorHeader(name, meta["dtype"], tuple(meta["shape"]), file,
                     base + meta["data_offsets"][0], base + meta["data_offsets"][1])
        for name, meta in header.items()
        if name != "__metadata__"
    ]


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (sharded or not)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / name for name in names]
    else:
        files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no safetensors weights in {model_dir}: gatehead reads .safetensors checkpoints only")
    return files


def checkpoint_headers(model_dir: Path) -> dict[str, TensorHeader]:
    """All tensor headers of a checkpoint directory, by tensor name."""
    return {h.name: h for file in checkpoint_files(model_dir) for h in read_headers(file)}


def fingerprint(model_dir: Path) -> str:
    """A short hash identifying the weights in `model_dir` (see the module docstring)."""
    digest = hashlib.sha256()
    handles: dict[Path, object] = {}
    try:
        for name, h in sorted(checkpoint_headers(Path(model_dir)).items()):
            digest.update(f"{name}|{h.dtype}|{list(h.shape)}|".encode())
            f = handles.get(h.file) or handles.setdefault(h.file, open(h.file, "rb"))  # noqa: SIM115
            f.seek(h.start)
            digest.update(f.read(min(FINGERPRINT_BYTES, h.end - h.start)))
    finally:
        for f in handles.values():
            f.close()
    return "sha256:" + digest.hexdigest()[:32]
