"""Reading one file into documents: Markdown, plain text, HTML, PDF and JSONL, by file extension.

Markdown: the title is the first line's `# ` heading (else the file name), optionally followed by a
`Tags: a, b` line; YAML-style front matter with `title:` and `tags:` works too. Both are taken out
of the text. HTML: visible text (menus left out), headings written as `#` lines so chunking can break on them.
PDF: the text layer of every page, through pypdf (scans without one have no text). JSONL: one
document per line, `text` plus optional `title` and `tags`; other fields are kept as metadata (`meta`),
as they are, and the line number apart from them (`line`).
A file that can't be read raises `Unreadable` with the reason; nothing here decides what to skip.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Document:
    """Text to chunk, and what every chunk of it carries."""

    text: str
    source: str  # the unit that ingestion replaces and deletes: a path relative to the ingested root
    title: str = ""
    tags: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)  # a JSONL record's other fields, as they are
    line: int | None = None  # the JSONL record's line number: apart from `meta`, which may hold a "line" of its own


class Unreadable(Exception):
    """The file could not be read as its type; the message says why."""


def _decode(data: bytes) -> str:
    # NUL bytes never occur in text files, and any UTF-8 failure means this is not text we can index.
    if b"\x00" in data[:8192]:
        raise Unreadable("binary file")
    try:
        return data.decode("utf-8-sig").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        raise Unreadable(f"binary or not UTF-8 text (byte {e.start})") from e


def _tags(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = value.strip().strip("[]")
        value = value.split(",") if "," in value else value.split()
    if not isinstance(value, list):
        return ()
    return tuple(t for t in (str(v).strip().strip("'\"").lstrip("#") for v in value) if t)


def _markdown(path: Path, source: str) -> list[Document]:
    text = _decode(path.read_bytes())
    title, tags = "", ()
    front = re.match(r"---\n(.*?)\n---\n", text, re.DOTALL)
    if front:
        fields = dict(line.split(":", 1) for line in front.group(1).splitlines() if ":" in line)
        fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
        title, tags = fields.get("title", "").strip("'\""), _tags(fields.get("tags", ""))
        text = text[front.end():]
    lines = text.lstrip("\n").split("\n")
    if lines and re.match(r"#\s", lines[0]):
        title = title or lines[0][1:].strip()
        lines = lines[1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
        if lines and re.match(r"(?i)tags\s*:", lines[0]):
            tags = tags or _tags(lines[0].split(":", 1)[1])
            lines = lines[1:]
    return [Document("\n".join(lines).strip(), source, title or path.stem, tags)]


def _plain(path: Path, source: str) -> list[Document]:
    return [Document(_decode(path.read_bytes()).strip(), source, path.stem)]


_BLOCK_TAGS = ("p", "div", "li", "tr", "br", "pre", "blockquote", "section", "article", "table", "ul", "ol",
               "dl", "dt", "dd", "figcaption", "main", "aside")


def _html(path: Path, source: str) -> list[Document]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(_decode(path.read_bytes()), "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup(["script", "style", "noscript", "template", "head", "svg", "nav"]):  # not content
        tag.decompose()
    for tag in soup.find_all(re.compile(r"^h[1-6]$")):
        title = title or tag.get_text(" ", strip=True)
        tag.insert_before(f"\n\n{'#' * int(tag.name[1])} ")
        tag.insert_after("\n\n")
    for tag in soup.find_all(_BLOCK_TAGS):
        tag.insert_before("\n\n")
        tag.insert_after("\n\n")
    # Inline markup leaves stray spaces and newlines inside a paragraph: one space each, paragraphs kept.
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", soup.get_text()))
    return [Document("\n\n".join(p for p in paragraphs if p), source, title or path.stem)]


def _pdf(path: Path, source: str) -> list[Document]:
    from pypdf import PdfReader

    try:
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unreadable("encrypted PDF")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
        title = str(reader.metadata.title or "") if reader.metadata else ""
    except Unreadable:
        raise
    except Exception as e:  # pypdf raises many types on a damaged file; any of them means "can't read it"
        raise Unreadable(f"not a readable PDF ({type(e).__name__}: {e})") from e
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise Unreadable("PDF without a text layer (a scan needs OCR first)")
    return [Document(text, source, title.strip() or path.stem)]


def _jsonl(path: Path, source: str) -> list[Document]:
    documents = []
    for number, line in enumerate(_decode(path.read_bytes()).split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise Unreadable(f"line {number}: not valid JSON ({e.msg})") from e
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise Unreadable(f"line {number}: expected an object with a 'text' string")
        meta = {k: v for k, v in record.items() if k not in ("text", "title", "tags")}
        documents.append(Document(record["text"].strip(), source, str(record.get("title") or ""),
                                  _tags(record.get("tags", [])), meta, number))
    return documents


LOADERS: dict[str, Callable[[Path, str], list[Document]]] = {
    ".md": _markdown, ".markdown": _markdown, ".txt": _plain, ".html": _html, ".htm": _html,
    ".pdf": _pdf, ".jsonl": _jsonl,
}


def load(path: Path, source: str) -> list[Document]:
    """The documents in `path` (a type `LOADERS` knows), each with `source`; `Unreadable` if it can't be read."""
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise Unreadable(f"unsupported type (ingested: {', '.join(sorted(LOADERS))})")
    try:
        return loader(path, source)
    except OSError as e:
        raise Unreadable(f"cannot read: {e.strerror or e}") from e
