"""Retrieval settings: one frozen config each for the embedder, the store and ingestion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EmbedderConfig:
    """Which sentence-transformers model embeds chunks and queries, and how."""

    model: str | Path | None = None  # a model directory or hub id; None = the bundled all-MiniLM-L6-v2
    batch_size: int = 64
    device: str | None = None  # None: sentence-transformers picks (CUDA when available)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class StoreConfig:
    """Where the Qdrant collection lives: embedded storage on disk (`path`) or a server (`url`)."""

    path: str | Path = ".cache/qdrant"  # ":memory:" for a throwaway store; ignored when `url` is set
    url: str | None = None
    api_key: str | None = None
    collection: str = "gatehead"

    def __post_init__(self) -> None:
        if not self.collection or "/" in self.collection:
            raise ValueError(f"collection must be a non-empty name without '/', got {self.collection!r}")
        if self.api_key and not self.url:
            raise ValueError("api_key is for a Qdrant server: give its url too, or drop the key for local storage")

    @property
    def location(self) -> str:
        """The store as people name it in messages."""
        return self.url or str(self.path)


@dataclass(frozen=True)
class IngestConfig:
    """How documents are cut into chunks and written."""

    chunk_tokens: int = 200  # embedder tokens per chunk; the title, embedded with each chunk, is cut to the rest
    overlap: int = 32  # tokens repeated from the previous chunk when a chunk ends mid-section
    batch_size: int = 64  # chunks embedded and written together
    progress: bool = True
    prune: bool = True  # remove the chunks of files gone from a directory given: the collection mirrors it

    def __post_init__(self) -> None:
        if self.chunk_tokens < 16:
            raise ValueError(f"chunk_tokens must be >= 16, got {self.chunk_tokens}")
        if not 0 <= self.overlap <= self.chunk_tokens // 2:
            raise ValueError(f"overlap must be in [0, chunk_tokens / 2 = {self.chunk_tokens // 2}], "
                             f"got {self.overlap}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
