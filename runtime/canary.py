"""Canaries: known-answer gate and generation requests, recorded at start-up and re-run to catch a sick engine.

A serving fault (a corrupted prefix-cache block, a branch weight overwritten, KV rows swapped) makes
the engine answer differently from how it answered the same request when it was known to be well.
`Canaries.record` runs a few fixed requests several times, alone and side by side, and keeps what
they gave: each gate canary's probabilities, and each generation canary's greedy tokens with their
logprobs, up to the first token the runs disagree on or whose lead over the runner-up is thin (a
near tie may legitimately flip with batch composition). `check` runs them again: a gate canary
matches within `gate_tolerance` (max |dp|), a generation canary when its tokens are the same and their
logprobs within the tolerance recorded from the runs' own spread. Generation canaries read the prefix
cache their earlier runs filled, so a cached block that changed shows. A failed check is run again
soon; after `unready_after` consecutive failed checks `healthy` is False (the server's `/readyz` answers
503), and checks return to the interval (or a poke); a passing check makes it True again. A check that
cannot run at all (its server gone) logs its traceback once, then a line per check. This module does not
decide what to do about a sick engine beyond saying so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from gatehead.gate.policy import LABELS
from gatehead.gate.prompt import Passage
from gatehead.runtime.affinity import pinned

log = logging.getLogger("gatehead.canary")


@dataclass(frozen=True)
class CanaryConfig:
    """How canaries run. `interval` 0 records them at start-up and checks only when asked (`poke`)."""

    interval: float = 60.0  # seconds between checks
    gate_tolerance: float = 0.02  # max |dp| of a gate canary against its recording
    min_logprob_tolerance: float = 0.1  # floor of a generation canary's recorded tolerance (nats)
    min_margin: float = 0.5  # a recorded token must lead the runner-up by this much (nats)
    max_tokens: int = 16  # greedy tokens a generation canary asks for
    repeats: int = 3  # recording runs: the first alone, the others all canaries side by side
    unready_after: int = 3  # consecutive failed checks before `healthy` turns False
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.interval < 0:
            raise ValueError(f"CanaryConfig.interval must be >= 0 seconds, got {self.interval}")
        if not 0 < self.gate_tolerance < 1:
            raise ValueError(f"CanaryConfig.gate_tolerance must be in (0, 1), got {self.gate_tolerance}")
        for name in ("min_logprob_tolerance", "min_margin"):
            if getattr(self, name) <= 0:
                raise ValueError(f"CanaryConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("max_tokens", "unready_after"):
            if getattr(self, name) < 1:
                raise ValueError(f"CanaryConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.repeats < 2:
            raise ValueError("CanaryConfig.repeats must be >= 2: one run shows no spread")


@dataclass(frozen=True)
class Canary:
    """One known-answer request: a question over passages, asked of the gate or answered by generation."""

    name: str
    kind: str  # "gate" or "generation"
    question: str
    passages: tuple[Passage, ...]

    def __post_init__(self) -> None:
        if self.kind not in ("gate", "generation"):
            raise ValueError(f"a canary's kind is 'gate' or 'generation', not {self.kind!r}")


def _passage(title: str, text: str) -> Passage:
    return Passage(text=text, title=title, source=f"canary/{title.lower().replace(' ', '-')}.md")


# Plain prose that any model tokenizes: what is checked is that the engine answers as it did, not
# that the answer is right. Long enough that generation canaries fill whole prefix-cache blocks.
_KETTLE = _passage("Harbour Kettle", "The Harbour Kettle is a stovetop kettle made of brushed steel. It holds 1.7 "
                   "litres, weighs 900 g and comes with a five-year warranty. Its handle stays cool, and its whistle "
                   "can be switched off. It works on gas, electric and induction hobs.")
_RETURNS = _passage("Returns policy", "Unused items can be returned within 30 days of delivery for a full refund. "
                    "Returns are free for members; others pay a flat fee of 4 euros. Refunds reach the original "
                    "payment method within 10 business days of the parcel arriving at the warehouse.")
_FERRY = _passage("Ferry timetable", "The morning ferry leaves the north pier at 07:15 and reaches the island at "
                  "08:05. On weekends the first crossing is at 09:00. Bicycles travel free; cars must be booked a "
                  "day ahead, and the last return crossing leaves the island at 21:40.")
DEFAULT_CANARIES = (
    Canary("gate-answerable", "gate", "How much does the Harbour Kettle hold?", (_KETTLE, _RETURNS)),
    Canary("gate-unrelated", "gate", "Who won the football world cup in 1998?", (_FERRY,)),
    Canary("gate-empty", "gate", "When does the first weekend ferry leave?", ()),
    # (Asked "How much does the Harbour Kettle weigh?", the stop-31 demo model's first token led by 0.06 nats.)
    Canary("generation-kettle", "generation", "How many litres does the Harbour Kettle hold?",
           (_KETTLE, _RETURNS, _FERRY)),
    Canary("generation-ferry", "generation", "When does the last return ferry leave the island?", (_FERRY, _KETTLE)),
)


@dataclass(frozen=True)
class GateRecord:
    probs: tuple[float, ...]  # in LABELS order


@dataclass(frozen=True)
class GenerationRecord:
    token_ids: tuple[int, ...]  # the leading greedy tokens every recording run agreed on, each with a clear lead
    logprobs: tuple[float, ...]
    tolerance: float  # max |d logprob| a check may show


@dataclass(frozen=True)
class Mismatch:
    """One canary that did not match its recording, with the diff that is logged."""

    canary: str
    diff: str


@dataclass
class CanaryState:
    """What `/readyz` and `/metrics` read."""

    checks: int = 0
    failed_checks: int = 0
    consecutive: int = 0  # failed checks in a row
    last: list[Mismatch] = field(default_factory=list)


class Canaries:
    """Records the canaries on an engine, re-runs them, and says whether the engine still answers as recorded."""

    def __init__(self, engine, config: CanaryConfig = CanaryConfig(),
                 canaries: Sequence[Canary] = DEFAULT_CANARIES, server: str | None = None) -> None:
        """`server`: one of a remote engine's servers, which every canary request is pinned to."""
        if engine.adapter is None:
            raise ValueError("canaries watch a shared engine: start it with a gate adapter")
        if len({c.name for c in canaries}) != len(canaries):
            raise ValueError("canary names must be unique")
        self.engine, self.config, self.canaries, self.server = engine, config, list(canaries), server
        self.records: dict[str, GateRecord | GenerationRecord] = {}
        self.state = CanaryState()
        self._wake = asyncio.Event()

    @property
    def healthy(self) -> bool:
        return self.state.consecutive < self.config.unready_after

    async def _run(self, canary: Canary) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
        """(probs, (), ()) for a gate canary; (token ids, logprobs, margins) for a generation canary."""
        with pinned(self.server):
            if canary.kind == "gate":
                outcome = await self.engine.gate(canary.question, canary.passages)
                return tuple(outcome.result.probs[label] for label in LABELS), (), ()
            prompt = self.engine.prompts.build(canary.question, canary.passages).answer
            return await self.engine.greedy_margins(prompt, self.config.max_tokens)

    async def record(self) -> None:
        """Run every canary `repeats` times (alone first, then side by side) and keep what they gave.

        A canary whose runs disagree beyond what a check allows (a gate canary by more than
        `gate_tolerance`, an answer canary from its first token) is left out, with a log line.
        """
        runs = [[await self._run(c) for c in self.canaries]]
        for _ in range(self.config.repeats - 1):
            runs.append(list(await asyncio.gather(*(self._run(c) for c in self.canaries))))
        for i, canary in enumerate(self.canaries):
            mine = [run[i] for run in runs]
            if canary.kind == "gate":
                spread = max(abs(a - b) for other in mine[1:] for a, b in zip(mine[0][0], other[0], strict=True))
                if spread > self.config.gate_tolerance:  # it would fail checks on a well engine
                    log.error("canary %s left out: the gate gave probabilities %.4f apart over %d runs of the same "
                              "request, over the tolerance %s", canary.name, spread, len(mine),
                              self.config.gate_tolerance)
                    continue
                self.records[canary.name] = GateRecord(mine[0][0])
                continue
            kept = 0
            for step in range(min(len(ids) for ids, _, _ in mine)):
                agreed = len({ids[step] for ids, _, _ in mine}) == 1
                if not agreed or min(m[step] for _, _, m in mine) < self.config.min_margin:
                    break
                kept = step + 1
            if kept == 0:
                log.warning("canary %s left out: its first token has no clear lead on this model", canary.name)
                continue
            spread = max(abs(a - b) for _, lps, _ in mine[1:] for a, b in zip(mine[0][1][:kept], lps[:kept],
                                                                                strict=False))
            self.records[canary.name] = GenerationRecord(tuple(mine[0][0][:kept]), tuple(mine[0][1][:kept]),
                                                         max(self.config.min_logprob_tolerance, 4 * spread))
        log.info("canaries recorded: %s", ", ".join(f"{name} ({_describe(r)})" for name, r in self.records.items()))

    async def check(self) -> list[Mismatch]:
        """Run the recorded canaries side by side; the mismatches (logged), and the state updated."""
        recorded = [c for c in self.canaries if c.name in self.records]
        results = await asyncio.gather(*(self._run(c) for c in recorded))
        mismatches = [m for c, r in zip(recorded, results, strict=True)
                      if (m := self._compare(c.name, r)) is not None]
        self._counted(mismatches)
        for m in mismatches:
            log.error("canary mismatch (%d in a row): %s: %s", self.state.consecutive, m.canary, m.diff)
        return mismatches

    def _counted(self, mismatches: list[Mismatch], failed: bool = False) -> None:
        """One check in the state: failed when it had mismatches or could not run (`failed`)."""
        self.state.checks += 1
        self.state.last = mismatches
        if mismatches or failed:
            self.state.failed_checks += 1
            self.state.consecutive += 1
            if self.healthy:  # check again soon: a fault shows in consecutive checks, a fluke does not
                self._wake.set()  # (once unready: at the interval, or when poked)
        else:
            if not self.healthy:
                log.warning("canaries match again after %d failed checks", self.state.consecutive)
            self.state.consecutive = 0

    def _compare(self, name: str, result) -> Mismatch | None:
        record = self.records[name]
        if isinstance(record, GateRecord):
            worst = max(abs(a - b) for a, b in zip(record.probs, result[0], strict=True))
            if worst <= self.config.gate_tolerance:
                return None
            return Mismatch(name, f"gate probabilities {_fmt(result[0])} vs recorded {_fmt(record.probs)} "
                                  f"(max |dp| {worst:.4f} > {self.config.gate_tolerance})")
        ids, lps = result[0][:len(record.token_ids)], result[1][:len(record.token_ids)]
        if tuple(ids) != record.token_ids:
            at = next((i for i, (a, b) in enumerate(zip(ids, record.token_ids, strict=False)) if a != b), len(ids))
            return Mismatch(name, f"greedy tokens differ from step {at}: {list(ids)} vs recorded "
                                  f"{list(record.token_ids)} ({self.engine.tokenizer.decode(ids)!r} vs "
                                  f"{self.engine.tokenizer.decode(record.token_ids)!r})")
        worst = max(abs(a - b) for a, b in zip(lps, record.logprobs, strict=True))
        if worst <= record.tolerance:
            return None
        return Mismatch(name, f"logprobs {_fmt(lps)} vs recorded {_fmt(record.logprobs)} "
                              f"(max |d| {worst:.4f} > {record.tolerance:.4f})")

    def poke(self) -> None:
        """Check soon (after an error the caller saw), instead of waiting for the interval."""
        self._wake.set()

    async def watch(self) -> None:
        """Check every `interval` seconds and whenever poked, until cancelled. A failing check never raises."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.interval or None)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - a canary that cannot run is a failed check, not a dead watcher
                if self.state.consecutive == 0 or self.state.last:  # the first of a run of such checks: the trace
                    log.exception("canary check could not run%s", f" on {self.server}" if self.server else "")
                else:
                    log.error("canary check still cannot run%s (%d failed checks in a row): %s: %s",
                              f" on {self.server}" if self.server else "", self.state.consecutive + 1,
                              type(error).__name__, error)
                self._counted([], failed=True)
            await asyncio.sleep(1.0)  # pokes that came during the check are served by the next one


class CanaryGroup:
    """Canaries on each server of a remote engine, each pinned to its server: healthy while every server's are;
    `state` sums their checks (a mismatch names its server)."""

    def __init__(self, engine, config: CanaryConfig = CanaryConfig(),
                 canaries: Sequence[Canary] = DEFAULT_CANARIES) -> None:
        self.members = [Canaries(engine, config, canaries, server.url) for server in engine.servers]

    @property
    def healthy(self) -> bool:
        return all(m.healthy for m in self.members)

    @property
    def state(self) -> CanaryState:
        states = [m.state for m in self.members]
        return CanaryState(sum(s.checks for s in states), sum(s.failed_checks for s in states),
                           max(s.consecutive for s in states),
                           [Mismatch(f"{m.server}: {x.canary}", x.diff) for m in self.members for x in m.state.last])

    async def record(self) -> None:
        await asyncio.gather(*(m.record() for m in self.members))

    def poke(self) -> None:
        for member in self.members:
            member.poke()

    async def watch(self) -> None:
        await asyncio.gather(*(m.watch() for m in self.members))


def watching(engine, config: CanaryConfig = CanaryConfig()) -> Canaries | CanaryGroup:
    """The canaries of `engine`: one set, or one per server where it has several (`RemoteEngine`)."""
    return CanaryGroup(engine, config) if hasattr(engine, "servers") else Canaries(engine, config)


def _fmt(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"


def _describe(record: GateRecord | GenerationRecord) -> str:
    if isinstance(record, GateRecord):
        return "gate " + _fmt(record.probs)
    return f"{len(record.token_ids)} tokens, tolerance {record.tolerance:.3f}"
