"""Chunking with the embedder's tokenizer: budgets hold, sections start chunks, overlap stays inside a section."""

from __future__ import annotations

import re

import pytest

from gatehead.retrieval.chunking import chunk_text, with_title
from gatehead.retrieval.embedder import Embedder


def n_tokens(embedder: Embedder, text: str) -> int:
    return len(embedder.tokenizer(text, add_special_tokens=False)["input_ids"])


def sentences(topic: str, n: int) -> str:
    return " ".join(f"The {topic} rule number {i} says that item {i} must be checked twice." for i in range(n))


def test_every_chunk_fits_and_every_sentence_is_kept(embedder: Embedder) -> None:
    text = (f"Intro to the manual.\n\n## Warranty\n{sentences('warranty', 30)}\n\n## Returns\n"
            f"- keep the receipt\n- use the original box\n\n{sentences('returns', 12)}")
    chunks = chunk_text(text, embedder.tokenizer, max_tokens=60, overlap=10)
    assert len(chunks) >= 10
    assert max(n_tokens(embedder, c) for c in chunks) <= 60
    for sentence in re.findall(r"[^.]+\.", text.replace("\n", " ")):
        assert any(sentence.strip() in c.replace("\n", " ") for c in chunks), sentence
    assert all(c == c.strip() and c for c in chunks)


def test_a_section_starts_a_chunk_and_small_sections_share_one(embedder: Embedder) -> None:
    sections = "\n\n".join(f"## Part {i}\n{sentences(f'part {i}', 2)}" for i in range(4))
    chunks = chunk_text(sections, embedder.tokenizer, max_tokens=64, overlap=8)
    # each section (~40 tokens) is too big to share a 64-token chunk: one chunk per section, heading first
    assert [c.split("\n")[0] for c in chunks] == [f"## Part {i}" for i in range(4)]
    # sections of 8 tokens join the next until the chunk holds a quarter of the budget (16)
    tiny = [f"## Part {i}\nShort note {i}." for i in range(4)]
    assert chunk_text("\n\n".join(tiny), embedder.tokenizer, max_tokens=64, overlap=8) == [
        "\n\n".join(tiny[:2]), "\n\n".join(tiny[2:])]


def test_overlap_repeats_the_tail_within_a_section_only(embedder: Embedder) -> None:
    text = f"## Long\n{sentences('battery', 12)}\n\n## Next\n{sentences('router', 3)}"
    chunks = chunk_text(text, embedder.tokenizer, max_tokens=50, overlap=10)
    next_at = next(i for i, c in enumerate(chunks) if c.startswith("## Next"))
    assert next_at >= 2
    for before, after in zip(chunks[:next_at - 1], chunks[1:next_at], strict=True):  # breaks inside "## Long"
        shared = max(k for k in range(len(after) + 1) if before.endswith(after[:k]))
        assert 8 <= n_tokens(embedder, after[:shared]) <= 12, (before, after)
    assert "router" not in chunks[next_at - 1] and "battery" not in chunks[next_at]


def test_a_heading_is_never_the_last_line_of_a_chunk(embedder: Embedder) -> None:
    text = f"{sentences('intro', 2)}\n\n## Heading\n{sentences('body', 2)}"
    chunks = chunk_text(text, embedder.tokenizer, max_tokens=45, overlap=0)
    assert len(chunks) >= 2 and not any(c.endswith("## Heading") for c in chunks)
    assert any(c.startswith("## Heading\n") for c in chunks)


def test_comments_in_code_blocks_are_not_headings(embedder: Embedder) -> None:
    def manual(comment: str) -> str:
        steps = "\n".join(f"{comment} step {i}: fetch the package\npip install package-{i}" for i in range(8))
        return (f"## Install\n{sentences('install', 2)}\n\n```sh\n{steps}\n```\n\n    {comment} indented code\n\n"
                f"~~~\n{steps}\n~~~\n\n## Use\n{sentences('use', 2)}")

    # a `#` comment in code is cut like any other line of code (`;` here), not as the start of a section
    commented = chunk_text(manual("#"), embedder.tokenizer, max_tokens=64, overlap=8)
    assert commented == [c.replace("; ", "# ") for c in chunk_text(manual(";"), embedder.tokenizer, 64, 8)]
    assert len(commented) >= 4 and commented[-1].startswith("## Use")


def test_a_title_gives_way_to_its_chunk_in_the_window(embedder: Embedder) -> None:
    chunk = sentences("valve", 3)  # ~45 tokens
    assert with_title("Valves", chunk, embedder.tokenizer, 60) == f"Valves\n{chunk}"
    title = "The complete and unabridged handbook of valves, seals and gaskets"
    fitted = with_title(title, chunk, embedder.tokenizer, 52)
    assert n_tokens(embedder, fitted) <= 52 and fitted.endswith(f"\n{chunk}")
    assert title.startswith(fitted.split("\n")[0]) and len(fitted.split("\n")[0]) < len(title)
    assert with_title(title, chunk, embedder.tokenizer, n_tokens(embedder, chunk)) == chunk
    assert with_title("", chunk, embedder.tokenizer, 60) == chunk


def test_text_without_any_break_is_cut_at_tokens(embedder: Embedder) -> None:
    text = " ".join(f"alpha{i} beta gamma" for i in range(100))  # no newline, no sentence end
    chunks = chunk_text(text, embedder.tokenizer, max_tokens=40, overlap=0)
    assert max(n_tokens(embedder, c) for c in chunks) <= 40
    assert " ".join(chunks) == text


def test_empty_text_and_bad_sizes(embedder: Embedder) -> None:
    assert chunk_text(" \n\n ", embedder.tokenizer, max_tokens=40) == []
    with pytest.raises(ValueError, match="overlap < max_tokens"):
        chunk_text("text", embedder.tokenizer, max_tokens=40, overlap=40)
