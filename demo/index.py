"""The demo index: the demo corpus in embedded Qdrant, built on first use and kept up to date after."""

from __future__ import annotations

from pathlib import Path

from gatehead.demo import DEMO_DIR

COLLECTION = "demo"
DEFAULT_PATH = Path(".cache/qdrant")


def open_demo_store(path: str | Path = DEFAULT_PATH, embedder=None, log=print):
    """The demo corpus's store at `path`; ingests the corpus first (unchanged files are skipped)."""
    from gatehead.retrieval.config import IngestConfig, StoreConfig
    from gatehead.retrieval.embedder import Embedder
    from gatehead.retrieval.ingest import ingest
    from gatehead.retrieval.store import Store

    store = Store(StoreConfig(path=path, collection=COLLECTION), embedder or Embedder())
    try:
        report = ingest([DEMO_DIR / "corpus"], store, IngestConfig(progress=False))
    except BaseException:
        store.close()
        raise
    if report.added or report.updated or report.removed:
        log(f"Demo index at {path}: {report.summary()}")
    return store


def open_agent_store(config=None, log=print):
    """(store, default thread-checkpoint target) for the agent: `config`'s store, or the demo index if None."""
    from gatehead.agent.checkpoint import default_checkpoint_path
    from gatehead.retrieval.config import StoreConfig
    from gatehead.retrieval.embedder import Embedder
    from gatehead.retrieval.store import Store

    store = open_demo_store(log=log) if config is None else Store(config, Embedder())
    return store, str(default_checkpoint_path(config or StoreConfig(path=DEFAULT_PATH, collection=COLLECTION)))
