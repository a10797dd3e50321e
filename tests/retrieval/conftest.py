"""Fixtures for retrieval tests: a corpus writer and the `gatehead` command (the embedder is in tests/conftest.py)."""

from __future__ import annotations

import sys
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


@pytest.fixture(scope="session")
def gatehead_cli() -> str:
    """The `gatehead` command installed next to the running Python."""
    return str(Path(sys.executable).parent / "gatehead")
