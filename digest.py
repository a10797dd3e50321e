"""`fingerprint`: the sha256 that names a file or a folder of files (a model, an adapter) wherever gatehead records
or checks which one it is: results files' provenance (`gatehead.provenance`), the model id a `vllm serve` of
the gate reports (`gatehead.runtime.vllm_serve`). It imports nothing of gatehead, so every floor may use it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def fingerprint(path: Path) -> str:
    """sha256 over a file, or over a folder's files (their relative names and bytes, in name order)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    if not files:
        raise FileNotFoundError(f"nothing to fingerprint at {path}")
    for f in files:
        digest.update(str(f.relative_to(path) if f != path else f.name).encode() + b"\0")
        with f.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()
