"""The answer started beside the gate: submitted with it, held until the gate decides, then released or aborted.

Sequentially, a turn whose gate says `answer` waits for the gate, then submits its answer, which queues a
second time (behind other turns' prefills under load). Started beside the gate, the two are submitted in the
same turn of the event loop: the gate prompt is the answer prompt plus the invocation suffix, so whichever
the scheduler takes first prefills the shared prefix and the other reads it from the prefix cache (vLLM
caches a block when it is scheduled), and the answer's first tokens are ready when the gate returns.
Nothing of it is seen until then: its generations are held here; on `answer` the `generate` node reads them
exactly as it reads a fresh stream, and on any other decision, on a failed gate, or when the run ends
without reading them, the request is aborted and the decode tokens it had made are counted as wasted.
This module does not decide anything and sends nothing the user sees.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

_END = object()


class HeldAnswer:
    """One answer request in flight, its generations queued until `release` or `abort`."""

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._last: Any = None
        self.submitted, self.first_token = time.perf_counter(), None  # perf_counter() times
        self._task = asyncio.ensure_future(self._pump(stream))

    async def _pump(self, stream: AsyncIterator[Any]) -> None:
        try:
            async for out in stream:
                if out.token_ids and self.first_token is None:
                    self.first_token = time.perf_counter()
                self._last = out
                self._queue.put_nowait(out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to whoever reads the answer, raised there
            self._queue.put_nowait(exc)
        finally:
            self._queue.put_nowait(_END)

    @property
    def tokens(self) -> int:
        """Decode tokens generated so far."""
        return len(self._last.token_ids) if self._last is not None else 0

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens it read from the prefix cache, as its last generation reported (0 before one came)."""
        return (self._last.num_cached_tokens or 0) if self._last is not None else 0

    async def release(self) -> AsyncIterator[Any]:
        """The generations, held ones first, then as they come (the answer's error raised where it fell).
        Leaving early (a closed or cancelled reader) aborts the request."""
        try:
            while (item := await self._queue.get()) is not _END:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self._task.cancel()

    async def abort(self) -> int:
        """Abort the request (cancelling its stream aborts it in vLLM); the decode tokens it had made."""
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():  # the caller itself was cancelled, not the held stream
                raise
        return self.tokens


class HeldAnswers:
    """One run's held answers, by what was asked (prompt ids, budget, tenant): the `gate` node starts one,
    `generate` takes the one for its prompt, and whatever is left when the run ends is aborted."""

    def __init__(self) -> None:
        self._held: dict[tuple, HeldAnswer] = {}

    def start(self, engine: Any, prompt: Sequence[int], *, max_tokens: int, cache_salt: str | None,
              priority: int = 0) -> HeldAnswer:
        key = (tuple(prompt), max_tokens, cache_salt)
        assert key not in self._held, "one held answer per prompt: the last gate's was released or aborted"
        held = self._held[key] = HeldAnswer(engine.stream(list(prompt), max_tokens=max_tokens,
                                                          cache_salt=cache_salt, priority=priority))
        return held

    def take(self, prompt: Sequence[int], *, max_tokens: int, cache_salt: str | None) -> HeldAnswer | None:
        """The held answer for exactly this request, no longer held here; None if there is none."""
        return self._held.pop((tuple(prompt), max_tokens, cache_salt), None)

    async def drop(self, held: HeldAnswer) -> int:
        """Abort `held` (a gate that did not say `answer`); the decode tokens it wasted."""
        self._held = {k: v for k, v in self._held.items() if v is not held}
        return await held.abort()

    async def abort_all(self) -> int:
        """Abort every answer still held (a run that ended without reading it); the tokens they wasted."""
        held, self._held = list(self._held.values()), {}
        return sum([await h.abort() for h in held])
