"""The demo index: the demo corpus in embedded Qdrant, built on first use and kept up to date after."""

from __future__ import annotations

from pathlib import Path

from gatehead.demo import DEMO_DIR

COLLECTION = "demo"
DEFAULT_PATH = Path(".cache/qdrant")
CORPUS = DEMO_DIR / "corpus"


def demo_store_config(path: str | Path = DEFAULT_PATH):
    """Where the demo index lives (embedded Qdrant)."""
    from gatehead.retrieval.config import StoreConfig

    return StoreConfig(path=path, collection=COLLECTION)


def open_demo_store(path: str | Path = DEFAULT_PATH, embedder=None, log=print):
    """The demo corpus's store at `path`; ingests the corpus first (unchanged files are skipped)."""
    from gatehead.retrieval.ingest import open_store

    return open_store(demo_store_config(path), [CORPUS], embedder, log)
