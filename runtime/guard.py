"""The degenerate-output guard: repetition loops, garbled text and runs of improbable tokens in a generation.

Serving bugs (a prefix-cache block read before it was written, KV rows swapped between requests)
show up as output that looks like a model failure: a loop, byte garbage, a script soup, tokens the
model itself found improbable. `check` looks at one generation so far (its token ids, text and the
sampled tokens' logprobs) and names the first fault it finds, or None. `GuardConfig` holds the
limits. `guarded` holds a stream's last `window` tokens back until the check clears them, and
`GuardedEngine` puts every generation of an engine through it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gatehead.gate.adapter import GateAdapter
    from gatehead.gate.policy import Thresholds
    from gatehead.gate.prompt import Passage, PromptBuilder, Turn
    from gatehead.runtime.engine import GateOutcome, SharedEngine

REASONS = ("repetition", "garbled", "improbable")


@dataclass(frozen=True)
class GuardConfig:
    """Limits of the guard. A fault must hold for the whole span named, so short echoes pass."""

    window: int = 32  # tokens a stream holds back until the guard clears them
    # Repetition: the generation ends in a unit of 1..max_period tokens repeated back to back,
    # covering at least min_span tokens and min_repeats units.
    max_period: int = 16
    min_span: int = 24
    min_repeats: int = 4
    # Garbled: characters no clean text carries (U+FFFD from broken bytes, control, private-use or
    # unassigned code points) or words mixing letters of several scripts.
    max_bad_chars: int = 1  # more than this many trips
    max_mixed_words: int = 1
    # Improbable: this many sampled tokens in a row, each below this logprob.
    improbable_run: int = 8
    improbable_logprob: float = -6.0
    enabled: bool = True

    def __post_init__(self) -> None:
        for name in ("window", "max_period", "min_span", "min_repeats", "improbable_run"):
            if getattr(self, name) < 1:
                raise ValueError(f"GuardConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.min_repeats < 2:
            raise ValueError("GuardConfig.min_repeats must be >= 2: one occurrence is no repetition")
        if self.improbable_logprob >= 0:
            raise ValueError("GuardConfig.improbable_logprob must be negative")


@dataclass(frozen=True)
class Trip:
    """What the guard found: one of REASONS and a human-readable detail."""

    reason: str
    detail: str


def repetition(ids: Sequence[int], config: GuardConfig) -> Trip | None:
    """A loop at the end of `ids`: the shortest period p whose back-to-back repeats cover the tail."""
    n = len(ids)
    for period in range(1, min(config.max_period, n // config.min_repeats) + 1):
        span = period
        while span < n and ids[n - 1 - span] == ids[n - 1 - span + period]:
            span += 1
        if span >= max(config.min_span, period * config.min_repeats):
            return Trip("repetition", f"the last {span} tokens repeat a {period}-token unit")
    return None


def _script(ch: str) -> str | None:
    """The script of a letter (LATIN, CYRILLIC, CJK, ...), None for anything else."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    for script in ("CJK", "HIRAGANA", "KATAKANA", "HANGUL"):
        if script in name:
            return "CJK"  # one writing system in practice: Japanese mixes them within words
    return name.split(" ")[0] or None


def _bad_char(ch: str) -> bool:
    if ch in "\n\t\r":
        return False
    return ch == "\ufffd" or unicodedata.category(ch) in ("Cc", "Co", "Cn", "Cs")


def _bad_chars(text: str) -> list[str]:
    return [ch for ch in text if _bad_char(ch)]


def _mixed_words(text: str) -> list[str]:
    return [w for w in text.split() if len({s for s in map(_script, w) if s}) > 1]


def _garbled_trip(bad: Sequence[str], mixed: Sequence[str], config: GuardConfig) -> Trip | None:
    if len(bad) > config.max_bad_chars:
        return Trip("garbled", f"{len(bad)} characters that clean text does not carry "
                               f"({', '.join(sorted({f'U+{ord(c):04X}' for c in bad})[:5])})")
    if len(mixed) > config.max_mixed_words:
        return Trip("garbled", f"{len(mixed)} words mix scripts ({', '.join(repr(w) for w in mixed[:3])})")
    return None


def garbled(text: str, config: GuardConfig) -> Trip | None:
    """Byte garbage or script soup in `text`."""
    return _garbled_trip(_bad_chars(text), _mixed_words(text), config)


def improbable(logprobs: Sequence[float], config: GuardConfig) -> Trip | None:
    """A run of sampled tokens the model itself found improbable."""
    run = 0
    for lp in logprobs:
        run = run + 1 if lp < config.improbable_logprob else 0
        if run >= config.improbable_run:
            return Trip("improbable", f"{run} tokens in a row below logprob {config.improbable_logprob}")
    return None


class Checker:
    """`check` for one growing generation, in time proportional to what each call adds.

    A stream is checked after every step; scanning its whole text each time would cost O(n^2) over
    a long generation. The checker keeps the counts of the text up to its last whitespace (whole
    words) and of the logprobs seen, and rescans only the rest. A text that shrank (a stop string
    cut at the end) is rescanned whole.
    """

    def __init__(self, config: GuardConfig, forbidden: Collection[int] = ()) -> None:
        self.config, self.forbidden = config, frozenset(forbidden)
        self._ids = self._logprobs = self._run = self._done = 0
        self._bad: list[str] = []
        self._mixed: list[str] = []

    def __call__(self, ids: Sequence[int], text: str, logprobs: Sequence[float]) -> Trip | None:
        config = self.config
        if not config.enabled:
            return None
        stray = [t for t in ids[self._ids:] if t in self.forbidden]
        self._ids = len(ids)
        if stray:
            return Trip("garbled", f"reserved token ids in the output: {sorted(set(stray))[:5]}")
        trip = repetition(ids, config)
        if trip is not None:
            return trip
        if len(text) < self._done:
            self._done, self._bad, self._mixed = 0, [], []
        cut = len(text)
        while cut > self._done and not text[cut - 1].isspace():
            cut -= 1
        if cut > self._done:  # whole words since the last call: counted for good
            segment = text[self._done:cut]
            self._bad += _bad_chars(segment)
            self._mixed += _mixed_words(segment)
            self._done = cut
        tail = text[self._done:]  # the word still being written: counted this time only
        trip = _garbled_trip(self._bad + _bad_chars(tail), self._mixed + _mixed_words(tail), config)
        if trip is not None:
            return trip
        for lp in logprobs[self._logprobs:]:
            self._run = self._run + 1 if lp < config.improbable_logprob else 0
            if self._run >= config.improbable_run:
                return Trip("improbable", f"{self._run} tokens in a row below logprob {config.improbable_logprob}")
        self._logprobs = len(logprobs)
        return None


def check(ids: Sequence[int], text: str, logprobs: Sequence[float], config: GuardConfig,
          forbidden: Collection[int] = ()) -> Trip | None:
    """The first fault in a generation, or None. `forbidden`: ids no generation may contain (the
    gate's reserved tokens)."""
    return Checker(config, forbidden)(ids, text, logprobs)


class DegenerateOutput(RuntimeError):
    """A guarded stream tripped after some of its tokens were released: the stream ends here."""

    def __init__(self, trip: Trip, released_tokens: int) -> None:
        super().__init__(f"degenerate output ({trip.reason}): {trip.detail}")
        self.trip, self.released_tokens = trip, released_tokens


@dataclass
class GuardCounters:
    """What the guard did, for `/metrics`: trips by reason, retries, streams ended, streams checked."""

    checked: int = 0
    retries: int = 0
    ended: int = 0
    trips: dict[str, int] | None = None
    on_trip: Callable[[], None] | None = None  # told of every trip (the server checks its canaries then)

    def trip(self, reason: str) -> None:
        self.trips = self.trips or {r: 0 for r in REASONS}
        self.trips[reason] += 1
        if self.on_trip is not None:
            self.on_trip()


async def guarded(open_stream, config: GuardConfig, counters: GuardCounters, forbidden: Collection[int] = ()):
    """Yield a generation as the engine's cumulative stream does, `config.window` tokens behind it.

    `open_stream(bypass_prefix_cache: bool)` opens the engine stream (cumulative outputs with
    `token_ids`, `text`, `logprobs`, `finish_reason`). Each output is checked (`Checker`); what is released
    is an earlier output of the same stream, so released text is always exactly what the engine
    decoded for those tokens. A trip before anything was released aborts the request and retries it
    once with the prefix cache bypassed (a corrupted cached block is the usual suspect); a trip after
    a release, or on the retry, raises `DegenerateOutput`.
    """
    from contextlib import aclosing

    if not config.enabled:
        async with aclosing(open_stream(False)) as stream:
            async for out in stream:
                yield out
        return
    counters.checked += 1
    for attempt in (0, 1):
        released, pending, checker = 0, [], Checker(config, forbidden)
        async with aclosing(open_stream(attempt == 1)) as stream:
            async for out in stream:
                trip = checker(out.token_ids, out.text, out.logprobs)
                if trip is not None:
                    counters.trip(trip.reason)
                    if released == 0 and attempt == 0:
                        counters.retries += 1
                        break  # aclosing aborts the engine request
                    counters.ended += 1
                    raise DegenerateOutput(trip, released)
                if out.finish_reason is not None:
                    yield out
                    return
                pending.append(out)
                ready = [p for p in pending if len(p.token_ids) <= len(out.token_ids) - config.window]
                if ready:
                    released = len(ready[-1].token_ids)
                    pending = pending[len(ready):]
                    yield ready[-1]
            else:
                return


class GuardedEngine:
    """An engine whose generations pass the guard: `stream` and `generate` guarded, gates as they are.

    What the server hands the agent and its plain-generation routes. It offers what the agent asks
    of an engine (`gatehead.agent.context.Engine`) and nothing else of the engine it wraps.
    """

    def __init__(self, engine: SharedEngine, config: GuardConfig = GuardConfig(),
                 counters: GuardCounters | None = None) -> None:
        self.engine, self.guard, self.counters = engine, config, counters or GuardCounters()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def adapter(self) -> GateAdapter | None:
        return self.engine.adapter

    @property
    def prompts(self) -> PromptBuilder | None:
        return self.engine.prompts

    async def gate(self, question: str, passages: Sequence[Passage] = (), conversation: Sequence[Turn] = (), *,
                   thresholds: Thresholds | None = None, cache_salt: str | None = None) -> GateOutcome:
        return await self.engine.gate(question, passages, conversation, thresholds=thresholds, cache_salt=cache_salt)

    def stream(self, prompt, **kwargs):
        return guarded(lambda bypass: self.engine.stream(prompt, bypass_prefix_cache=bypass, **kwargs), self.guard,
                       self.counters, self.engine.gate_reserved)

    async def generate(self, prompt, **kwargs):
        out = None
        async for out in self.stream(prompt, **kwargs):  # noqa: B007 - the last output is the whole generation
            pass
        assert out is not None, "the engine ended the stream without output"
        return out
