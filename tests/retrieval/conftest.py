"""A corpus writer for retrieval tests (the session's embedder is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture
def write_corpus(tmp_path: Path) -> Callable[[dict[str, str | bytes], str], Path]:
    """Writes {relative path: content} under tmp_path/name and returns that directory."""

    def write(files: dict[str, str | bytes], name: str = "corpus") -> Path:
        root = tmp_path / name
        for relative, content in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return root

    return write
