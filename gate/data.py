"""Labelled gate examples: reading JSONL, checking every line, laying each out as the engine will.

One JSON object per line: `question` (str), `documents` (list of str or of objects with `text` and
optional `title`, `source`, `score`), `label` ("answer" | "refuse" | "search"), optional
`conversation` (list of {"role": "user" | "assistant", "content": str}). Errors name the file and
line. An example whose documents or turns would not fit the context is an error: dropping the
passage an `answer` label rests on would teach the gate the wrong thing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatehead.gate.policy import LABELS
from gatehead.gate.prompt import Passage, PromptBuilder, Turn


@dataclass(frozen=True)
class Example:
    """One labelled gate decision."""

    question: str
    passages: tuple[Passage, ...]
    label: str
    conversation: tuple[Turn, ...] = ()
    where: str = ""  # file:line it came from, for errors


def parse_passage(doc: Any, where: str) -> Passage:
    """A document of a JSONL record: a string or {"text", "title"?, "source"?, "score"?}."""
    if isinstance(doc, str):
        return Passage(text=doc)
    if isinstance(doc, dict) and isinstance(doc.get("text"), str):
        return Passage(text=doc["text"], title=str(doc.get("title", "")), source=str(doc.get("source", "")),
                       score=float(doc.get("score", 0.0)))
    raise ValueError(f"{where}: each document is a string or an object with a 'text' string")


def parse_example(data: Any, where: str) -> Example:
    """An `Example` from one decoded JSONL object; `where` names the file and line in errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object")
    for name in ("question", "documents", "label"):
        if name not in data:
            raise ValueError(f"{where}: missing field '{name}'")
    if not isinstance(data["question"], str) or not data["question"].strip():
        raise ValueError(f"{where}: 'question' must be a non-empty string")
    if data["label"] not in LABELS:
        raise ValueError(f"{where}: unknown label {data['label']!r}; labels are {list(LABELS)}")
    if not isinstance(data["documents"], list):
        raise ValueError(f"{where}: 'documents' must be a list")
    turns = data.get("conversation") or []
    def valid(turn: Any) -> bool:
        return isinstance(turn, dict) and turn.get("role") in ("user", "assistant") \
            and isinstance(turn.get("content"), str)

    if not isinstance(turns, list) or not all(valid(t) for t in turns):
        raise ValueError(f"{where}: 'conversation' is a list of {{'role': 'user'|'assistant', 'content': str}}")
    return Example(data["question"], tuple(parse_passage(d, where) for d in data["documents"]), data["label"],
                   tuple(Turn(t["role"], t["content"]) for t in turns), where)


def jsonl_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(where, decoded object) per non-empty line; a line that is not JSON raises with its number."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from e


def read_examples(path: str | Path) -> list[Example]:
    """All examples of a JSONL file; the first bad line raises with its number."""
    examples = [parse_example(data, where) for where, data in jsonl_records(path)]
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def gate_prompts(examples: Sequence[Example], builder: PromptBuilder) -> list[tuple[int, ...]]:
    """Each example's gate prompt; an example that does not fit whole is an error naming it."""
    prompts = []
    for i, example in enumerate(examples, 1):
        where = example.where or f"example {i}"
        try:
            prompt = builder.build(example.question, example.passages, example.conversation)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        if prompt.dropped.turns or prompt.dropped.passages:
            raise ValueError(f"{where}: its documents and conversation overflow the {builder.config.max_context}-"
                             f"token context (the budget would drop {len(prompt.dropped.passages)} passage(s) and "
                             f"{len(prompt.dropped.turns)} turn(s)); shorten them or raise max_context")
        prompts.append(prompt.gate)
    return prompts
