"""Labelled JSONL: every bad line is named with its number; overflowing examples are errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatehead.gate.data import gate_prompts, read_examples
from gatehead.gate.prompt import Passage, PromptBuilder, PromptConfig


def write(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = json.dumps({"question": "q?", "documents": ["a", {"text": "b", "title": "B", "score": 0.5}], "label": "answer"})


def test_reads_documents_and_conversation(tmp_path: Path) -> None:
    row = {"question": "and then?", "documents": [], "label": "search",
           "conversation": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    first, second = read_examples(write(tmp_path, GOOD, "", json.dumps(row)))
    assert first.passages == (Passage("a"), Passage("b", "B", "", 0.5)) and first.where.endswith(":1")
    assert second.conversation[1].role == "assistant" and second.where.endswith(":3")


@pytest.mark.parametrize("line,message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"documents": [], "label": "answer"}), "missing field 'question'"),
    (json.dumps({"question": "q", "documents": [], "label": "maybe"}), "unknown label 'maybe'"),
    (json.dumps({"question": "q", "documents": "text", "label": "answer"}), "'documents' must be a list"),
    (json.dumps({"question": "q", "documents": [3], "label": "answer"}), "each document is a string"),
    (json.dumps({"question": "q", "documents": [], "label": "refuse", "conversation": [{"role": "system"}]}),
     "'conversation' is a list"),
])
def test_bad_lines_are_named(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"data.jsonl:2: {message}"):
        read_examples(write(tmp_path, GOOD, line))


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no examples"):
        read_examples(write(tmp_path, ""))


def test_documents_that_overflow_the_context_are_an_error(tmp_path: Path, tokenizer) -> None:
    long_doc = json.dumps({"question": "q?", "documents": ["word " * 400], "label": "answer"})
    examples = read_examples(write(tmp_path, GOOD, long_doc))
    builder = PromptBuilder(tokenizer, "<|gate|>", PromptConfig(max_context=200, answer_tokens=1))
    with pytest.raises(ValueError, match=r"data.jsonl:2: its documents and conversation overflow the 200-token"):
        gate_prompts(examples, builder)
