"""Ingestion: files to chunks to points, idempotently; a changed file's old chunks are replaced, never orphaned.

A point's id is uuid5 of its source, its chunk text and how many identical chunks precede it in that
source, so an unchanged chunk keeps its id and is neither embedded nor written again, and a run over
unchanged files writes nothing. Per file, the chunks that are new or whose payload changed (title,
tags, position) are embedded and written first, and only once they are stored are the file's other
chunks deleted. Why that order: neither embedded Qdrant nor the server has transactions (embedded
storage even commits point by point), so a crash can stop anywhere; with writes before deletes it
leaves every file as it was, or as it was plus some of its new chunks, never with chunks missing. A
search in between may see both versions of one file. The next run compares the files with what is
stored, writes what is missing and deletes what is stale: it ends exactly where a clean run would.

Sources are paths relative to the ingested directory (a file given directly: its name), the same on
every machine. A file that can't be read is skipped and keeps whatever an earlier run stored; a file
removed from disk keeps its chunks until its source is deleted (`gatehead ingest --delete SOURCE`).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gatehead.retrieval.chunking import chunk_text
from gatehead.retrieval.config import IngestConfig
from gatehead.retrieval.embedder import Embedder
from gatehead.retrieval.loaders import Document, Unreadable, load
from gatehead.retrieval.store import Store

_NAMESPACE = uuid.UUID("6f1c2a43-3d55-4b8e-9a63-0c2f4d6e8b17")  # fixed forever: ids must not change


@dataclass(frozen=True)
class Skipped:
    """A file left out, and why."""

    path: str
    reason: str


@dataclass
class IngestReport:
    """What one ingestion run did."""

    files: int = 0  # files read
    chunks: int = 0  # chunks in the files read
    added: int = 0
    updated: int = 0  # same chunk text, new payload (title, tags, position): embedded and written again
    removed: int = 0
    seconds: float = 0.0
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def unchanged(self) -> int:
        return self.chunks - self.added - self.updated

    @property
    def chunks_per_second(self) -> float:
        """Chunks embedded and written per second of the whole run."""
        return (self.added + self.updated) / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        return (f"{self.files} files, {len(self.skipped)} skipped; {self.chunks} chunks: {self.added} added, "
                f"{self.updated} updated, {self.removed} removed, {self.unchanged} unchanged; "
                f"{self.seconds:.1f} s ({self.chunks_per_second:.1f} chunks/s embedded and written)")


@dataclass(frozen=True)
class Point:
    """One chunk as stored: id, payload, and the text its vector is made from."""

    id: str
    payload: dict[str, Any]
    embed_text: str  # the title, then the chunk: a chunk deep in a document still says what it is about


def find_files(paths: Sequence[str | Path]) -> list[tuple[Path, str]]:
    """Every file under `paths` with its source name; hidden files and folders are left out."""
    found: dict[str, Path] = {}
    for root in map(Path, paths):
        if root.is_dir():
            files = [(p, p.relative_to(root).as_posix()) for p in sorted(root.rglob("*"))
                     if not p.is_dir() and not any(part.startswith(".") for part in p.relative_to(root).parts)]
        elif root.exists() or root.is_symlink():
            files = [(root, root.name)]
        else:
            raise ValueError(f"{root} does not exist: give files or directories to ingest")
        for path, source in files:
            other = found.setdefault(source, path)
            if other.absolute() != path.absolute():
                raise ValueError(f"{other} and {path} would both be source {source!r} (a path relative to the "
                                 f"directory given): ingest a directory that holds both, or ingest them into "
                                 f"separate collections (--collection)")
    return [(path, source) for source, path in found.items()]


def point_id(source: str, text: str, occurrence: int = 0) -> str:
    """The id of the `occurrence`-th chunk with this text in `source`."""
    return str(uuid.uuid5(_NAMESPACE, f"{source}\x1f{occurrence}\x1f{text}"))


def chunk_points(documents: Sequence[Document], embedder: Embedder, config: IngestConfig) -> list[Point]:
    """The points of one file's documents."""
    seen: Counter[tuple[str, str]] = Counter()
    points = []
    for doc in documents:
        for index, text in enumerate(chunk_text(doc.text, embedder.tokenizer, config.chunk_tokens, config.overlap)):
            payload = {"source": doc.source, "title": doc.title, "tags": list(doc.tags), "chunk_index": index,
                       "text": text, "meta": dict(doc.meta)}
            canonical = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
            payload["fingerprint"] = hashlib.sha256(canonical.encode()).hexdigest()[:32]
            points.append(Point(point_id(doc.source, text, seen[doc.source, text]), payload,
                                f"{doc.title}\n{text}" if doc.title else text))
            seen[doc.source, text] += 1
    return points


class _Writer:
    """Embeds and writes points in batches; deletes a file's stale points only once its new ones are stored."""

    def __init__(self, store: Store, batch_size: int) -> None:
        self.store, self.batch_size = store, batch_size
        self.queue: list[Point] = []
        self.deletes: list[tuple[int, list[str]]] = []  # (points queued up to that file's last, its stale ids)
        self.queued = self.written = 0

    def add(self, points: list[Point], stale: list[str]) -> None:
        self.queue += points
        self.queued += len(points)
        self.deletes.append((self.queued, stale))
        while len(self.queue) >= self.batch_size:
            self._write()
        self._delete_due()

    def flush(self) -> None:
        while self.queue:
            self._write()
        self._delete_due()

    def _write(self) -> None:
        batch, self.queue = self.queue[:self.batch_size], self.queue[self.batch_size:]
        vectors = self.store.embedder.encode([p.embed_text for p in batch])
        self.store.upsert([p.id for p in batch], vectors, [p.payload for p in batch])
        self.written += len(batch)

    def _delete_due(self) -> None:
        due = [ids for at, ids in self.deletes if at <= self.written]
        self.deletes = [(at, ids) for at, ids in self.deletes if at > self.written]
        self.store.delete_ids([i for ids in due for i in ids])


def ingest(paths: Sequence[str | Path], store: Store, config: IngestConfig | None = None) -> IngestReport:
    """Bring `store` up to date with the files under `paths` (see the module docstring)."""
    config = config or IngestConfig()
    start = time.perf_counter()
    embedder = store.embedder
    if embedder is None:
        raise ValueError("ingestion embeds chunks: open the store with an embedder")
    if config.chunk_tokens > embedder.max_tokens:
        raise ValueError(f"chunk_tokens={config.chunk_tokens} exceeds the {embedder.max_tokens} tokens that "
                         f"{embedder.name} reads at once: lower it")
    files = find_files(paths)
    stored = store.fingerprints()
    report = IngestReport()
    writer = _Writer(store, config.batch_size)
    # disable=None: tqdm draws the bar on a terminal only, so logs and pipes stay clean
    for path, source in tqdm(files, desc="ingest", unit="file", disable=None if config.progress else True):
        try:
            documents = load(path, source)
        except Unreadable as e:
            report.skipped.append(Skipped(str(path), str(e)))
            continue
        points = chunk_points(documents, embedder, config)
        old = stored.get(source, {})
        fresh = [p for p in points if old.get(p.id) != p.payload["fingerprint"]]
        keep = {p.id for p in points}
        stale = [i for i in old if i not in keep]
        report.files += 1
        report.chunks += len(points)
        report.added += sum(p.id not in old for p in fresh)
        report.updated += sum(p.id in old for p in fresh)
        report.removed += len(stale)
        writer.add(fresh, stale)
    writer.flush()
    report.seconds = time.perf_counter() - start
    return report
