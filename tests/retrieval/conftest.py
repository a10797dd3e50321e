"""One embedder, the bundled all-MiniLM-L6-v2, loaded once for every retrieval test; a corpus writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gatehead.retrieval.config import EmbedderConfig
from gatehead.retrieval.embedder import Embedder


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    embedder = Embedder(EmbedderConfig(device="cpu"))
    assert embedder.dimension == 384  # loads the model, here and only here
    return embedder


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
