"""Where agent threads persist: SQLite by default (a file next to the retrieval store), Postgres by URL.

`open_checkpointer(target)` is an async context manager yielding a LangGraph checkpointer; the
graph checkpoints after every node, so a thread survives restarts and an interrupted turn resumes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gatehead.retrieval.config import StoreConfig

THREADS_FILE = "threads.sqlite"


def default_checkpoint_path(store: StoreConfig) -> Path:
    """The SQLite file next to the store: beside its embedded directory, or in `.cache` for a server store."""
    return (Path(store.path).parent if store.url is None else Path(".cache")) / THREADS_FILE


def is_postgres(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(("postgres://", "postgresql://"))


@contextlib.asynccontextmanager
async def open_checkpointer(target: str | Path) -> AsyncIterator:
    """A checkpointer on `target`: a `postgres://` / `postgresql://` URL, else a SQLite file path."""
    if is_postgres(target):
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        try:
            manager = AsyncPostgresSaver.from_conn_string(str(target))
            saver = await manager.__aenter__()
        except Exception as exc:
            raise ConnectionError(f"cannot open the Postgres checkpointer at {_redacted(str(target))}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        try:
            await saver.setup()
            yield saver
        finally:
            await manager.__aexit__(None, None, None)
        return
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = Path(target)
    if path.is_dir():
        raise ValueError(f"the checkpoint path {path} is a directory; give a file path (e.g. {path / THREADS_FILE})")
    path.parent.mkdir(parents=True, exist_ok=True)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver


def _redacted(url: str) -> str:
    """The URL without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
