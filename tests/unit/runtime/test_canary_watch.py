"""The canaries' watcher when a check cannot run (its server gone): a trace once, then a line a check, and
quick re-checks only until the engine is declared unready."""

from __future__ import annotations

import asyncio
import logging

from gatehead.runtime import canary
from gatehead.runtime.canary import Canaries, CanaryConfig, GateRecord


class Gone:
    adapter = object()

    async def gate(self, question, passages):
        raise ConnectionError("connection refused")


def test_a_canary_that_cannot_run_logs_one_trace_and_stops_rechecking_once_unready(monkeypatch, caplog) -> None:
    watched = Canaries(Gone(), CanaryConfig(interval=0, unready_after=3), server="http://a")
    watched.records = {c.name: GateRecord((1.0, 0.0, 0.0)) for c in watched.canaries if c.kind == "gate"}
    pause = asyncio.sleep

    async def no_pause(seconds: float) -> None:
        await pause(0)

    monkeypatch.setattr(canary.asyncio, "sleep", no_pause)

    async def run() -> None:
        task = asyncio.create_task(watched.watch())
        watched.poke()
        for _ in range(200):  # no more pokes: the watcher re-checks on its own while the engine is healthy
            await pause(0)
        assert watched.state.checks == 3 and not watched.healthy
        watched.poke()  # a caller saw an error: one more check, and no more after it
        for _ in range(200):
            await pause(0)
        task.cancel()

    with caplog.at_level(logging.ERROR, logger="gatehead.canary"):
        asyncio.run(run())
    assert watched.state.checks == 4 and watched.state.consecutive == 4
    traces = [r for r in caplog.records if r.exc_info]
    lines = [r.getMessage() for r in caplog.records if not r.exc_info]
    assert len(traces) == 1 and "could not run on http://a" in traces[0].getMessage()
    assert lines == [f"canary check still cannot run on http://a ({n} failed checks in a row): ConnectionError: "
                     "connection refused" for n in (2, 3, 4)]
