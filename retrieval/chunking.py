"""Cutting text into chunks of at most N embedder tokens, breaking on headings, paragraphs and sentences.

Order of preference for a break: before a Markdown heading (`#` lines, but not inside ``` or ~~~
code fences, where `#` starts a shell or Python comment; the HTML loader writes its headings as `#`
lines too), between paragraphs (blank lines), between lines, between sentences, and only inside a
run of text with none of these at a token. A chunk that ends mid-section hands its
last `overlap` tokens (from a word start) to the next one; a chunk that ends at a heading does not,
since the next section is a new subject. A section smaller than a quarter of a chunk shares its
chunk with the next section. Sizes are counted with the embedder's own tokenizer, so a chunk fits
the model's window. This module does not load a model or embed anything.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

_HEADING = re.compile(r" {0,3}#{1,6}\s")  # indented further, it is code
_FENCE = re.compile(r" {0,3}(```|~~~)")
_SEPARATORS = (re.compile(r"\n"), re.compile(r"(?<=[.!?;:])\s+"))  # lines, then sentences


@dataclass(frozen=True)
class _Unit:
    """A span of text that is never cut again: a paragraph, line or sentence that fits."""

    start: int
    end: int
    heading: bool  # starts a section


class _Tokens:
    """Token counts of character spans of one text, from one tokenization of it."""

    def __init__(self, text: str, tokenizer: Any) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError("chunking needs a fast tokenizer (character offsets): use a sentence-transformers "
                             "model that ships a tokenizer.json")
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        self.starts = [start for start, _ in encoded["offset_mapping"]]

    def count(self, start: int, end: int) -> int:
        return bisect_left(self.starts, end) - bisect_left(self.starts, start)

    def first(self, start: int) -> int:
        """Index of the first token at or after character `start`."""
        return bisect_left(self.starts, start)


def _blocks(text: str) -> list[_Unit]:
    """Paragraphs (runs of non-blank lines), with every heading line a block of its own."""
    blocks: list[_Unit] = []
    start = end = None
    fence = None  # the marker (``` or ~~~) of the code block the line is in, if any
    for line in re.finditer(r"^.*$", text, re.MULTILINE):
        in_code = fence is not None
        marker = _FENCE.match(line.group())
        if marker and (not in_code or marker.group(1) == fence):
            fence = None if in_code else marker.group(1)
        if not line.group().strip() or (not in_code and _HEADING.match(line.group())):
            if start is not None:
                blocks.append(_Unit(start, end, False))
                start = None
            if line.group().strip():
                blocks.append(_Unit(line.start(), line.end(), True))
            continue
        start = line.start() if start is None else start
        end = line.end()
    if start is not None:
        blocks.append(_Unit(start, end, False))
    return blocks


def _word_start(text: str, at: int, floor: int) -> int:
    """`at` moved back to the start of its word, unless the word begins at or before `floor`."""
    back = at
    while back > floor and not text[back - 1].isspace():
        back -= 1
    return back if back > floor else at


def _split(text: str, unit: _Unit, tokens: _Tokens, max_tokens: int, level: int = 0) -> list[_Unit]:
    """`unit` as pieces of at most `max_tokens` tokens: at lines, then sentences, then token windows."""
    if tokens.count(unit.start, unit.end) <= max_tokens:
        return [unit]
    if level == len(_SEPARATORS):
        edges, at, last = [unit.start], tokens.first(unit.start), tokens.first(unit.end)
        while last - at > max_tokens:
            cut = _word_start(text, tokens.starts[at + max_tokens], tokens.starts[at])
            edges.append(cut)
            at = tokens.first(cut)
        edges.append(unit.end)
        return [_Unit(a, b, unit.heading and a == unit.start) for a, b in zip(edges[:-1], edges[1:], strict=True)]
    pieces, start = [], unit.start
    for match in _SEPARATORS[level].finditer(text, unit.start, unit.end):
        pieces.append(_Unit(start, match.start(), unit.heading and start == unit.start))
        start = match.end()
    pieces.append(_Unit(start, unit.end, unit.heading and start == unit.start))
    return [p for piece in pieces if text[piece.start:piece.end].strip()
            for p in _split(text, piece, tokens, max_tokens, level + 1)]


def _overlap_start(text: str, tokens: _Tokens, start: int, end: int, overlap: int) -> int | None:
    """Where the last `overlap` tokens of [start, end) begin, moved back to a word start; None if nowhere."""
    first, last = tokens.first(start), tokens.first(end)
    if last - first < 2:
        return None
    at = _word_start(text, tokens.starts[max(first + 1, last - overlap)], start)
    return at if start < at < end and text[at - 1].isspace() else None


def chunk_text(text: str, tokenizer: Any, max_tokens: int, overlap: int = 0) -> list[str]:
    """`text` cut into chunks of at most `max_tokens` tokens of `tokenizer` (see the module docstring)."""
    if max_tokens < 1 or not 0 <= overlap < max_tokens:
        raise ValueError(f"need max_tokens >= 1 and 0 <= overlap < max_tokens, got {max_tokens} and {overlap}")
    if not text.strip():
        return []
    tokens = _Tokens(text, tokenizer)
    units = [p for block in _blocks(text) for p in _split(text, block, tokens, max_tokens)]
    min_section = max_tokens // 4  # a chunk holding less does not end at a heading: tiny chunks retrieve badly
    spans: list[tuple[int, int]] = []
    current = units[:1]
    for unit in units[1:]:
        start = current[0].start
        new_section = unit.heading and not current[-1].heading and tokens.count(start, current[-1].end) >= min_section
        if tokens.count(start, unit.end) <= max_tokens and not new_section:
            current.append(unit)
            continue
        heading = current.pop() if current[-1].heading and len(current) > 1 else None  # never last in a chunk
        spans.append((start, current[-1].end))
        if heading is not None and tokens.count(heading.start, unit.end) <= max_tokens:
            current = [heading, unit]
            continue
        if heading is not None:  # too long to share a chunk with its first paragraph
            spans.append((heading.start, heading.end))
        mid_section = not unit.heading and heading is None and overlap
        follow = _overlap_start(text, tokens, start, current[-1].end, overlap) if mid_section else None
        fits = follow is not None and tokens.count(follow, unit.end) <= max_tokens
        current = [_Unit(follow, unit.start, False), unit] if fits else [unit]
    spans.append((current[0].start, current[-1].end))
    return [text[a:b].strip() for a, b in spans]


def with_title(title: str, text: str, tokenizer: Any, max_tokens: int) -> str:
    """`title`, a newline, then `text`: the title cut at a token so the whole holds at most `max_tokens` tokens.

    The chunk itself is never cut (it was made to fit); a title too long for the room left gives way.
    """
    if not title:
        return text
    while title:
        n = len(tokenizer(f"{title}\n{text}", add_special_tokens=False, verbose=False)["input_ids"])
        if n <= max_tokens:
            return f"{title}\n{text}"
        starts = [start for start, _ in tokenizer(title, add_special_tokens=False, return_offsets_mapping=True,
                                                  verbose=False)["offset_mapping"]]
        keep = len(starts) - (n - max_tokens)  # one title token per token over: exact unless tokens merge
        title = title[:starts[keep]].rstrip() if keep > 0 else ""
    return text
