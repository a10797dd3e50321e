"""The hand-written thread set: held out (test-split entities only), values in their documents, every case present."""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest

from gatehead.demo.kb import build_kb
from gatehead.demo.threads import CORPUS_DIR, EXPECTS, THREADS, Thread, ThreadError, ThreadTurn, load_threads

KB = build_kb(0)


@pytest.fixture(scope="module")
def threads() -> list[Thread]:
    return load_threads()


def _turns(threads: list[Thread]) -> list[ThreadTurn]:
    return [turn for thread in threads for turn in thread.turns]


def test_at_least_45_threads_of_two_to_four_turns(threads: list[Thread]) -> None:
    assert len(threads) >= 45
    assert all(2 <= len(t.turns) <= 4 for t in threads)
    assert len({t.thread_id for t in threads}) == len(threads)
    assert all(isinstance(t.turns, tuple) for t in threads)


def test_every_answer_value_occurs_in_its_source_document(threads: list[Thread]) -> None:
    answers = [turn for turn in _turns(threads) if turn.expect == "answer"]
    assert answers
    for turn in answers:
        text = (CORPUS_DIR / turn.source).read_text(encoding="utf-8")
        assert turn.value in text, (turn.message, turn.value, turn.source)
        assert KB.by_id[turn.source.removesuffix(".md")].entity == turn.entity
    for turn in _turns(threads):
        if turn.expect != "answer":
            assert turn.value == turn.source == ""


def test_every_entity_named_is_a_test_split_one(threads: list[Thread]) -> None:
    splits = {p.name: p.split for p in KB.products} | {p.name: p.split for p in KB.policies}
    named = {turn.entity for turn in _turns(threads) if turn.entity in splits}
    assert named and all(splits[name] == "test" for name in named)
    # Invented products are in no document under any name.
    known = {name.lower() for name in splits} | {p.former_name.lower() for p in KB.products if p.former_name}
    for turn in _turns(threads):
        if turn.case in ("switch-missing", "missing"):
            assert turn.entity and turn.entity.lower() not in known
            assert turn.entity.split()[0].lower() in turn.message.lower()
    # No message names a product, former name or order code of another split.
    held_in = [p for p in KB.products if p.split != "test"]
    banned = [p.name.lower() for p in held_in] + [p.code.lower() for p in held_in]
    banned += [p.former_name.lower() for p in held_in if p.former_name]
    for turn in _turns(threads):
        message = turn.message.lower()
        assert not [name for name in banned if re.search(rf"\b{re.escape(name)}\b", message)], turn.message


def test_every_kind_of_turn_is_present(threads: list[Thread]) -> None:
    turns = _turns(threads)
    cases, expects = Counter(t.case for t in turns), Counter(t.expect for t in turns)
    assert set(expects) == set(EXPECTS)
    for case in ("first", "pronoun", "switch", "switch-missing", "after-refusal", "off-topic", "order-code",
                 "support", "policy"):
        assert cases[case] >= 3, case
    assert cases["no-referent"] >= 5
    assert all(t.expect == "refuse" and t.entity == "" for t in turns if t.case == "off-topic")
    assert all(t.expect == "refuse" for t in turns if t.case == "switch-missing")


def test_cases_fit_their_place_in_the_thread(threads: list[Thread]) -> None:
    products = {p.name: p for p in KB.products}
    for thread in threads:
        first = thread.turns[0]
        if first.case == "no-referent":
            assert first.expect == "clarify" and first.entity == ""
        assert all(t.case != "no-referent" for t in thread.turns[1:])
        for before, turn in pairwise(thread.turns):
            if turn.case == "pronoun":  # the referent is the previous turn's entity
                assert turn.entity and turn.entity == before.entity, (thread.thread_id, turn.message)
            if turn.case == "switch":  # another real product, named in the message
                assert turn.entity != before.entity and turn.entity in products
                assert turn.entity.split()[0].lower() in turn.message.lower(), turn.message
            if turn.case == "after-refusal":
                assert before.expect == "refuse", (thread.thread_id, turn.message)
            if turn.case == "after-clarify":
                assert before.expect == "clarify", (thread.thread_id, turn.message)
        for turn in thread.turns:
            if turn.case == "order-code":
                assert products[turn.entity].code in turn.message, turn.message
            if turn.case == "support":
                assert turn.source.startswith("support/"), turn.message
            if turn.case == "policy":
                assert turn.source.startswith("policies/"), turn.message
    # A thread opened by a pronoun with nothing to refer to goes on with the product named.
    openers = [t for t in threads if t.turns[0].case == "no-referent"]
    assert len(openers) >= 5 and all(t.turns[1].case == "after-clarify" for t in openers)


def test_the_committed_file_is_one_json_object_a_line() -> None:
    lines = [line for line in THREADS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert all(isinstance(json.loads(line), dict) for line in lines)


_GOOD = {"message": "how much is the rowan lantern", "expect": "answer", "value": "€354",
         "source": "products/rowan-lantern.md", "entity": "Rowan Lantern", "case": "first"}
_FOLLOW = {"message": "and its weight?", "expect": "answer", "value": "1960 g", "source": "products/rowan-lantern.md",
           "entity": "Rowan Lantern", "case": "pronoun"}
_TRAIN = next(p for p in KB.products if p.split == "train")


def _write(tmp_path: Path, *turns: dict) -> Path:
    path = tmp_path / "threads.jsonl"
    path.write_text(json.dumps({"thread": "t1", "turns": list(turns)}, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def test_a_well_formed_line_loads(tmp_path: Path) -> None:
    (thread,) = load_threads(_write(tmp_path, _GOOD, _FOLLOW), kb=KB)
    assert thread == Thread("t1", (ThreadTurn(**_GOOD), ThreadTurn(**_FOLLOW)))


@pytest.mark.parametrize(("bad", "error"), [
    ({"expect": "answr"}, r"line 1 \(thread 't1'\) turn 2: expect 'answr' is not one of"),
    ({"value": ""}, "an answer turn needs a value and a source"),
    ({"source": ""}, "an answer turn needs a value and a source"),
    ({"source": "products/no-such-thing.md"}, "source 'products/no-such-thing.md' is not a document of the corpus"),
    ({"source": "../README.md"}, "is not a document of the corpus"),
    ({"value": "1961 g"}, "value '1961 g' does not occur in products/rowan-lantern.md"),
    ({"value": "960 g"}, "value '960 g' does not occur"),
    ({"source": "products/jet-tent.md"}, "source 'products/jet-tent.md' is about 'Jet Tent', not 'Rowan Lantern'"),
    ({"entity": _TRAIN.name, "source": f"products/{_TRAIN.slug}.md", "value": _TRAIN.facts[0].value},
     f"entity '{_TRAIN.name}' is of the train split"),
    ({"entity": "rowan lantern"}, "is spelled 'Rowan Lantern'"),
    ({"case": "pronon"}, "case 'pronon' is not one of"),
    ({"expect": "refuse"}, "only an answer turn has a value and source"),
    ({"expect": "clarify", "value": "", "source": "", "case": "no-referent"}, "a 'no-referent' turn opens its thread"),
    ({"expected": "answer"}, r"unknown keys \['expected'\]"),
    ({"value": 1960}, "'value' must be a string"),
])
def test_a_malformed_turn_raises_a_clear_error(tmp_path: Path, bad: dict, error: str) -> None:
    with pytest.raises(ThreadError, match=error):
        load_threads(_write(tmp_path, _GOOD, {**_FOLLOW, **bad}), kb=KB)


def test_malformed_lines_and_threads_raise_clear_errors(tmp_path: Path) -> None:
    path = tmp_path / "threads.jsonl"
    path.write_text('{"thread": "t1", "turns": [\n', encoding="utf-8")
    with pytest.raises(ThreadError, match="threads.jsonl line 1: not JSON"):
        load_threads(path, kb=KB)
    with pytest.raises(ThreadError, match="1 turns; a thread has 2-4"):
        load_threads(_write(tmp_path, _GOOD), kb=KB)
    with pytest.raises(ThreadError, match="5 turns; a thread has 2-4"):
        load_threads(_write(tmp_path, _GOOD, *[_FOLLOW] * 4), kb=KB)
    no_entity = {k: v for k, v in _FOLLOW.items() if k != "entity"}
    with pytest.raises(ThreadError, match="no 'entity'"):
        load_threads(_write(tmp_path, _GOOD, no_entity), kb=KB)
    with pytest.raises(ThreadError, match="a 'off-topic' turn expects 'refuse', not 'answer'"):
        load_threads(_write(tmp_path, _GOOD, {**_FOLLOW, "case": "off-topic"}), kb=KB)
    path.write_text(json.dumps({"thread": "t1", "turns": [_GOOD, _FOLLOW]}) + "\n"
                    + json.dumps({"thread": "t1", "turns": [_GOOD, _FOLLOW]}) + "\n", encoding="utf-8")
    with pytest.raises(ThreadError, match=r"line 2 \(thread 't1'\): thread id used twice"):
        load_threads(path, kb=KB)
