"""Hand-written multi-turn threads (`demo/threads-handwritten.jsonl`) about held-out entities, loaded and checked.

Each line is one thread: `{"thread": id, "turns": [turn, ...]}` with 2-4 turns, each
`{"message", "expect", "value", "source", "entity", "case"}`. `expect` is `answer` (then `value` is an
exact span of the corpus document `source`, e.g. "products/rowan-lantern.md"), `refuse` or `clarify`
(then `value` and `source` are absent or empty). `entity` names the product or policy the turn is about,
or is '' (off-topic, nothing to refer to); a product or policy that exists must be of the test split, so
the set is held out from training; a name the knowledge base lacks is an invented product (refuse).
`case` (optional) marks what the turn tests, one of `CASES`. The lines are typed by people, never
generated; `load_threads` only reads and checks them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gatehead.demo import DEMO_DIR, SEED
from gatehead.demo.kb import KnowledgeBase, build_kb

THREADS = DEMO_DIR / "threads-handwritten.jsonl"
CORPUS_DIR = DEMO_DIR / "corpus"
SPLIT = "test"
EXPECTS = ("answer", "refuse", "clarify")
MIN_TURNS, MAX_TURNS = 2, 4
CASES = (
    "first",  # an opening question that names its product
    "pronoun",  # a follow-up about the entity already in the thread ("and its weight?")
    "switch",  # a follow-up that names another real product ("what about the Jet Tent?")
    "switch-missing",  # a follow-up that names a product that does not exist (refuse)
    "missing",  # an opening question about a product that does not exist (refuse)
    "unknown",  # a fact no document holds about a real entity (refuse)
    "after-refusal",  # the turn after a refusal
    "after-clarify",  # the turn after a clarifying question
    "off-topic",  # a question about the world at large (refuse)
    "order-code",  # a question naming a product by its order code
    "support",  # a support-article question (the reset hold time or button)
    "policy",  # a question about a policy
    "no-referent",  # a pronoun question opening a thread: nothing to refer to (clarify)
)
# Cases whose turns can only have one outcome: a mislabelled turn is an error.
_CASE_EXPECTS = {"switch-missing": "refuse", "missing": "refuse", "unknown": "refuse", "off-topic": "refuse",
                 "no-referent": "clarify", "support": "answer", "policy": "answer", "order-code": "answer",
                 "switch": "answer", "first": "answer"}
_THREAD_KEYS = frozenset({"thread", "turns"})
_TURN_KEYS = frozenset({"message", "expect", "value", "source", "entity", "case"})


@dataclass(frozen=True)
class ThreadTurn:
    """One user message of a thread and what the agent should do with it."""

    message: str
    expect: str  # "answer" | "refuse" | "clarify"
    value: str = ""  # the exact answer span (answer turns only)
    source: str = ""  # the corpus document holding it, e.g. "products/rowan-lantern.md" (answer turns only)
    entity: str = ""  # the product or policy the turn is about, or ''
    case: str = ""  # what the turn tests, one of CASES, or ''


@dataclass(frozen=True)
class Thread:
    """A conversation: its id and its turns, in order."""

    thread_id: str
    turns: tuple[ThreadTurn, ...]


class ThreadError(ValueError):
    """A line of the threads file that breaks the schema or disagrees with the corpus."""


def _str(row: dict, key: str, where: str) -> str:
    value = row.get(key, "")
    if not isinstance(value, str):
        raise ThreadError(f"{where}: {key!r} must be a string, got {value!r}")
    return value


def _occurs(value: str, text: str) -> bool:
    """`value` in `text` as a whole span: "2 years" is not found in "12 years"."""
    return re.search(rf"(?<!\w){re.escape(value)}(?!\w)", text) is not None


def _turn(row: object, where: str, index: int, kb: KnowledgeBase, splits: dict[str, str],
          corpus_dir: Path) -> ThreadTurn:
    if not isinstance(row, dict):
        raise ThreadError(f"{where}: a turn must be a JSON object, got {row!r}")
    extra = sorted(set(row) - _TURN_KEYS)
    if extra:
        raise ThreadError(f"{where}: unknown keys {extra} (a turn has {sorted(_TURN_KEYS)})")
    if "entity" not in row:
        raise ThreadError(f"{where}: no 'entity' (use '' for a turn about no product or policy)")
    message, expect, value, source, entity, case = (_str(row, key, where) for key in
                                                    ("message", "expect", "value", "source", "entity", "case"))
    if not message.strip():
        raise ThreadError(f"{where}: empty message")
    if expect not in EXPECTS:
        raise ThreadError(f"{where}: expect {expect!r} is not one of {EXPECTS}")
    if case and case not in CASES:
        raise ThreadError(f"{where}: case {case!r} is not one of {CASES}")
    if case in _CASE_EXPECTS and expect != _CASE_EXPECTS[case]:
        raise ThreadError(f"{where}: a {case!r} turn expects {_CASE_EXPECTS[case]!r}, not {expect!r}")
    if case == "no-referent" and index != 0:
        raise ThreadError(f"{where}: a 'no-referent' turn opens its thread")
    known = {name.lower(): name for name in splits}
    if entity and entity.lower() in known and entity not in splits:
        raise ThreadError(f"{where}: entity {entity!r} is spelled {known[entity.lower()]!r} in the knowledge base")
    if entity in splits and splits[entity] != SPLIT:
        raise ThreadError(f"{where}: entity {entity!r} is of the {splits[entity]} split; threads use {SPLIT} "
                          "entities only")
    if case in ("switch-missing", "missing") and entity in splits:
        raise ThreadError(f"{where}: a {case!r} turn names a product that does not exist, not {entity!r}")
    if expect == "clarify" and entity:
        raise ThreadError(f"{where}: a clarify turn has nothing to refer to, so its entity is '', not {entity!r}")
    if expect != "answer":
        if value or source:
            raise ThreadError(f"{where}: only an answer turn has a value and source ({expect} has "
                              f"value {value!r}, source {source!r})")
        return ThreadTurn(message, expect, "", "", entity, case)
    if not value or not source:
        raise ThreadError(f"{where}: an answer turn needs a value and a source (value {value!r}, source {source!r})")
    if not entity:
        raise ThreadError(f"{where}: an answer turn names its entity")
    if entity not in splits:
        raise ThreadError(f"{where}: an answer turn's entity {entity!r} is no product or policy of the knowledge base")
    path = corpus_dir / source
    if not source.endswith(".md") or path.resolve().parent.parent != corpus_dir.resolve() or not path.is_file():
        raise ThreadError(f"{where}: source {source!r} is not a document of the corpus ({corpus_dir}), such as "
                          "'products/rowan-lantern.md'")
    doc = kb.by_id.get(source.removesuffix(".md"))
    if doc is not None and doc.entity != entity:
        raise ThreadError(f"{where}: source {source!r} is about {doc.entity!r}, not {entity!r}")
    if not _occurs(value, path.read_text(encoding="utf-8")):
        raise ThreadError(f"{where}: value {value!r} does not occur in {source}")
    return ThreadTurn(message, expect, value, source, entity, case)


def load_threads(path: Path = THREADS, corpus_dir: Path = CORPUS_DIR, kb: KnowledgeBase | None = None) -> list[Thread]:
    """The threads of `path`, each line checked against `corpus_dir` and the knowledge base (seed 0).

    Raises `ThreadError` (a ValueError) naming the file, line, thread and turn of the first bad line: JSON
    that does not parse, unknown keys, a bad `expect` or `case`, an answer turn without value or source,
    a source outside the corpus, a value its document does not hold, or an entity of another split.
    """
    kb = kb if kb is not None else build_kb(SEED)
    splits = {p.name: p.split for p in kb.products} | {p.name: p.split for p in kb.policies}
    splits |= {p.former_name: p.split for p in kb.products if p.former_name}
    threads: list[Thread] = []
    seen: set[str] = set()
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{Path(path).name} line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ThreadError(f"{where}: not JSON ({e})") from None
        if not isinstance(row, dict) or set(row) != _THREAD_KEYS:
            raise ThreadError(f"{where}: a thread is an object with exactly the keys {sorted(_THREAD_KEYS)}")
        thread_id, turns = row["thread"], row["turns"]
        if not isinstance(thread_id, str) or not thread_id.strip():
            raise ThreadError(f"{where}: thread id {thread_id!r} must be a non-empty string")
        where += f" (thread {thread_id!r})"
        if thread_id in seen:
            raise ThreadError(f"{where}: thread id used twice")
        seen.add(thread_id)
        if not isinstance(turns, list) or not MIN_TURNS <= len(turns) <= MAX_TURNS:
            count = len(turns) if isinstance(turns, list) else "no list of"
            raise ThreadError(f"{where}: {count} turns; a thread has {MIN_TURNS}-{MAX_TURNS}")
        checked = tuple(_turn(turn, f"{where} turn {i + 1}", i, kb, splits, corpus_dir)
                        for i, turn in enumerate(turns))
        threads.append(Thread(thread_id, checked))
    return threads
