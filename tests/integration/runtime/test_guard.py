"""The degenerate-output guard's checks on hand-made outputs (no engine)."""

from __future__ import annotations

import pytest

from gatehead.runtime.guard import GuardConfig, check, garbled, improbable, repetition

C = GuardConfig()
CLEAN = "The Rowan Lantern costs €354 [1]. It ships from Trondheim within 4 business days [2]."


def test_clean_answers_pass() -> None:
    ids = list(range(40))  # no repeated unit
    assert check(ids, CLEAN, [-0.1] * 40, C) is None
    assert garbled("Der Preis beträgt 354 € — prix: 354 €, цена 354 €. 価格は354ユーロです。", C) is None
    # an echo shorter than the span, and a list with a repeated separator, are not loops
    assert repetition([5, 6, 7, 5, 6, 7, 5, 6, 7, 1, 2], C) is None
    assert repetition([1, 9, 2, 9, 3, 9, 4, 9, 5, 9, 6, 9, 7, 9, 8, 9, 10, 9, 11, 9, 12, 9, 13, 9], C) is None


@pytest.mark.parametrize("unit", [[7], [3, 4], [10, 11, 12, 13, 14], list(range(100, 116))])
def test_loops_of_every_period_trip(unit: list[int]) -> None:
    repeats = max(C.min_repeats, -(-C.min_span // len(unit)))
    ids = [1, 2, 3] + unit * repeats
    trip = repetition(ids, C)
    assert trip is not None and trip.reason == "repetition" and f"{len(unit)}-token unit" in trip.detail
    shorter = [1, 2, 3] + (unit * repeats)[:max(C.min_span, len(unit) * C.min_repeats) - 1]
    assert repetition(shorter, C) is None  # one token short of the span


def test_byte_garbage_and_script_soup_trip() -> None:
    assert garbled(CLEAN + " \ufffd\ufffd", C).reason == "garbled"
    assert garbled(CLEAN + "\x00\x07", C).reason == "garbled"
    assert garbled(CLEAN + " \ufffd", C) is None  # one stray replacement character is allowed
    trip = garbled("The Rоwan Lаntern cоsts", C)  # Cyrillic о and а inside Latin words
    assert trip is not None and "mix scripts" in trip.detail


def test_runs_of_improbable_tokens_trip() -> None:
    assert improbable([-0.1] * 5 + [-12.0] * C.improbable_run, C).reason == "improbable"
    assert improbable([-12.0] * (C.improbable_run - 1) + [-0.5] + [-12.0] * 3, C) is None


def test_reserved_tokens_and_disabled_guard() -> None:
    assert check([1, 2, 99], "ok", [-0.1] * 3, C, forbidden={99}).reason == "garbled"
    assert check([7] * 64, "a" * 64, [-20.0] * 64, GuardConfig(enabled=False)) is None


@pytest.mark.parametrize("field,value", [("window", 0), ("min_repeats", 1), ("improbable_logprob", 0.0)])
def test_bad_config_is_refused(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        GuardConfig(**{field: value})


# ----- guarded streams on a real engine (the tiny model, shared with the other runtime tests) -----

PROMPT = "<|im_start|>user\nHow long is the warranty?<|im_end|>\n<|im_start|>assistant\n"
LENIENT = GuardConfig(window=8, min_span=10_000, max_bad_chars=10_000, max_mixed_words=10_000,
                      improbable_logprob=-1e9)


async def _collect(engine, config: GuardConfig, counters, forbidden=(), max_tokens: int = 32):
    from gatehead.runtime.guard import guarded

    seen = []
    async for out in guarded(lambda bypass: engine.stream(PROMPT, max_tokens=max_tokens, ignore_eos=True,
                                                          bypass_prefix_cache=bypass),
                             config, counters, forbidden):
        seen.append(out)
    return seen


def test_a_clean_stream_is_released_window_behind_and_unchanged(shared_eager, loop) -> None:
    from gatehead.runtime.guard import GuardCounters

    plain = loop.run(shared_eager.generate(PROMPT, max_tokens=32, ignore_eos=True))
    counters = GuardCounters()
    seen = loop.run(_collect(shared_eager, LENIENT, counters))
    assert seen[-1].token_ids == plain.token_ids and seen[-1].text == plain.text
    assert len(seen) > 2  # released as it goes, not all at the end
    for out in seen[:-1]:
        assert len(out.token_ids) <= 32 - LENIENT.window
        assert plain.token_ids[:len(out.token_ids)] == out.token_ids and plain.text.startswith(out.text)
    assert [len(o.token_ids) for o in seen] == sorted({len(o.token_ids) for o in seen})
    assert counters.checked == 1 and counters.retries == 0 and counters.trips is None


def test_a_trip_before_release_retries_once_then_fails(shared_eager, loop) -> None:
    from gatehead.runtime.guard import DegenerateOutput, GuardCounters

    always = GuardConfig(window=1000, improbable_run=1, improbable_logprob=-1e-30)  # every sampled token trips
    counters = GuardCounters()
    with pytest.raises(DegenerateOutput) as info:
        loop.run(_collect(shared_eager, always, counters))
    assert info.value.released_tokens == 0 and info.value.trip.reason == "improbable"
    assert counters.retries == 1 and counters.ended == 1 and counters.trips["improbable"] == 2
    assert loop.run(shared_eager.generate(PROMPT, max_tokens=4)).token_ids  # the engine serves on


def test_a_trip_after_release_ends_the_stream(shared_eager, loop) -> None:
    from gatehead.runtime.guard import DegenerateOutput, GuardCounters

    plain = loop.run(shared_eager.generate(PROMPT, max_tokens=32, ignore_eos=True)).token_ids
    late = next(i for i in range(12, 32) if plain[i] not in plain[:i])  # a token first seen at position i
    counters, seen = GuardCounters(), []

    async def run() -> None:
        from gatehead.runtime.guard import guarded

        async for out in guarded(lambda bypass: shared_eager.stream(PROMPT, max_tokens=32, ignore_eos=True),
                                 GuardConfig(window=4, min_span=10_000, max_bad_chars=10_000,
                                             max_mixed_words=10_000, improbable_logprob=-1e9),
                                 counters, forbidden={plain[late]}):
            seen.append(out)

    with pytest.raises(DegenerateOutput) as info:
        loop.run(run())
    assert info.value.released_tokens == len(seen[-1].token_ids) > 0
    assert len(seen[-1].token_ids) <= late + 1 - 4 and counters.retries == 0 and counters.ended == 1


def test_the_incremental_checker_sees_what_a_whole_check_sees() -> None:
    import random

    from gatehead.runtime.guard import Checker

    r = random.Random(0)
    pieces = ["The ", "Rowan ", "Lan", "tern ", "costs ", "€354 ", "[1].", "\n", "Р", "оwan ", "\ufffd", "x ",
              "価格", "は ", "\x07", "ok "]
    for _ in range(200):
        config = GuardConfig(max_bad_chars=r.choice([0, 1, 3]), max_mixed_words=r.choice([0, 1, 2]),
                             improbable_run=r.choice([2, 4]), min_span=r.choice([6, 24]), min_repeats=2)
        checker, ids, text, lps = Checker(config), [], "", []
        for _ in range(r.randrange(1, 30)):
            piece = r.choice(pieces)
            text += piece
            ids.append(r.choice([1, 2, 3, pieces.index(piece) + 10]))
            lps.append(r.choice([-0.1, -12.0]))
            incremental = checker(ids, text, lps)
            whole = check(ids, text, lps, config)
            separate = repetition(ids, config) or garbled(text, config) or improbable(lps, config)
            assert (whole is None) == (separate is None) and (whole is None or whole.reason == separate.reason)
            assert (incremental is None) == (whole is None) and (incremental is None or
                                                                  incremental.reason == whole.reason)
            if whole is not None:
                break
