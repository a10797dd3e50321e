"""Which server a request goes to, where an engine has several (`gatehead.runtime.remote.RemoteEngine`).

Two context variables, set around a block of calls and seen by the tasks it starts: `affinity(key)`
sends every request of the block to the server the key hashes to (the agent's nodes run under their
turn's key, `turn_key`: the tenant's thread, so a turn's gate, rewrites and answer meet on one server
and the answer reads the gate's prefix blocks); `pinned(url)` sends them to that server and nowhere
else (the canaries check each server this way). An in-process engine ignores both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_KEY: ContextVar[str | None] = ContextVar("gatehead_affinity", default=None)
_PINNED: ContextVar[str | None] = ContextVar("gatehead_pinned_server", default=None)


@contextlib.contextmanager
def affinity(key: str | None) -> Iterator[None]:
    """Send the block's requests to the server `key` prefers (rendezvous hashing), while it is in service (None:
    each request on its own)."""
    token = _KEY.set(key)
    try:
        yield
    finally:
        _KEY.reset(token)


@contextlib.contextmanager
def pinned(url: str | None) -> Iterator[None]:
    """Send the block's requests to the server at `url` only, in service or not (None: no pin)."""
    token = _PINNED.set(url)
    try:
        yield
    finally:
        _PINNED.reset(token)


def turn_key(cache_salt: str | None, thread_id: str) -> str:
    """The affinity key of an agent turn: its tenant's salt and its thread."""
    return f"{cache_salt or ''}\0{thread_id}"


def affinity_key() -> str | None:
    return _KEY.get()


def pinned_url() -> str | None:
    return _PINNED.get()
