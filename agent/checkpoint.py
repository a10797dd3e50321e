"""Where agent threads persist: SQLite by default (a file next to the retrieval store), Postgres by URL.

`open_checkpointer(target)` is an async context manager yielding a LangGraph checkpointer; the
graph checkpoints after every node, so a thread survives restarts and an interrupted turn resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from gatehead.retrieval.config import StoreConfig

THREADS_FILE = "threads.sqlite"
MIGRATION_LOCK = int.from_bytes(b"gatehead")  # the Postgres advisory lock key the checkpointer's migrations take
MIGRATION_WAIT_S = 300.0  # how long a replica waits for another's migrations before it gives up


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
            await _migrate(saver)
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


async def _migrate(saver) -> None:
    """LangGraph's migrations (`saver.setup()`), one process at a time: replicas starting together on a fresh
    database would each apply them and all but one fail on its version table ("duplicate key value violates
    unique constraint checkpoint_migrations_pkey"). A session advisory lock, released however setup ends, and
    asked for by polling: a process blocked in `pg_advisory_lock` sits in an open transaction, which the holder's
    `CREATE INDEX CONCURRENTLY` waits for (a deadlock Postgres reports). A holder that keeps the lock past
    `MIGRATION_WAIT_S` (a hung replica, a session left open by hand) is named in the error, not waited on forever."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + MIGRATION_WAIT_S
    while not await _try_lock(saver):
        if loop.time() > deadline and (holders := await _lock_holders(saver)):  # none: let go just now, try again
            raise TimeoutError(f"waited {MIGRATION_WAIT_S:.0f} s for the checkpointer's migration lock (Postgres "
                               f"advisory lock {MIGRATION_LOCK}), held by {holders}; end that session "
                               f"(SELECT pg_terminate_backend(pid)) or wait for its migrations to finish")
        await asyncio.sleep(0.2)
    try:
        await saver.setup()
    finally:
        async with saver.conn.cursor() as cur:
            await cur.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))


async def _try_lock(saver) -> bool:
    async with saver.conn.cursor() as cur:
        await cur.execute("SELECT pg_try_advisory_lock(%s) AS got", (MIGRATION_LOCK,))
        return bool((await cur.fetchone())["got"])


async def _lock_holders(saver) -> str:
    """The sessions holding the migration lock, as `pid N (application, client address)`; "" where none does."""
    async with saver.conn.cursor() as cur:
        await cur.execute("SELECT l.pid, a.application_name AS app, a.client_addr::text AS addr FROM pg_locks l "
                          "LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND "
                          "l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = %s", (MIGRATION_LOCK,))
        rows = await cur.fetchall()
    return ", ".join(f"pid {r['pid']} ({r['app'] or 'no application name'}, {r['addr'] or 'local socket'})"
                     for r in rows)


def _redacted(url: str) -> str:
    """The URL without its password."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
