"""Ingestion: files to chunks to points, idempotently; a changed file's old chunks are replaced, never orphaned.

A point's id is uuid5 of its source, its chunk text and how many identical chunks precede it in that
source, so an unchanged chunk keeps its id. Only chunks with a new id, or whose embedded text (title,
then chunk) changed, are embedded; a chunk whose other payload alone changed (its position, tags, a
JSONL record's line or fields) keeps its vector and gets the new payload written, and a run over
unchanged files writes nothing. Per file, new and changed chunks are written first, and only once
they are stored are the file's other chunks deleted. Why that order: neither embedded Qdrant nor
the server has transactions (embedded storage even commits point by point), so a crash can stop
anywhere; with writes before deletes it leaves every file as it was, or as it was plus some of its
new chunks, never with chunks missing. A search in between may see both versions of one file. The
next run compares the files with what is stored, writes what is missing and deletes what is stale:
it ends exactly where a clean run would.

Sources are named by `sources.find_files` (a path relative to the root it was ingested from). A
name belongs to one file of a collection: a run that would give a file the name another root's file
still holds is refused before it writes anything; if that other file is gone from disk (the tree
moved), the new one takes the name over. After the writes, chunks of files under a directory given
that are no longer on disk are removed (`IngestConfig.prune`). A file that can't be read is skipped
and keeps whatever an earlier run stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from gatehead.retrieval.chunking import chunk_text, with_title
from gatehead.retrieval.config import IngestConfig, StoreConfig
from gatehead.retrieval.embedder import Embedder
from gatehead.retrieval.loaders import Document, Unreadable, load
from gatehead.retrieval.sources import SourceFile, find_files
from gatehead.retrieval.store import Store, Stored

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
    updated: int = 0  # same chunk text, new payload (title, tags, position, metadata)
    removed: int = 0  # chunks deleted: stale chunks of files read, and all chunks of `pruned` sources
    embedded: int = 0  # chunks embedded: the added ones, and the updated ones whose title changed
    seconds: float = 0.0
    skipped: list[Skipped] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)  # sources whose files are gone from disk

    @property
    def unchanged(self) -> int:
        """Chunks of the files read that were already stored exactly so."""
        return self.chunks - self.added - self.updated

    @property
    def chunks_per_second(self) -> float:
        """Chunks embedded and written per second of the whole run."""
        return self.embedded / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        """One line for people: what changed, and how fast."""
        gone = f"; gone from disk: {', '.join(self.pruned)}" if self.pruned else ""
        return (f"{self.files} files, {len(self.skipped)} skipped; {self.chunks} chunks: {self.added} added, "
                f"{self.updated} updated, {self.removed} removed, {self.unchanged} unchanged; "
                f"{self.embedded} embedded in {self.seconds:.1f} s ({self.chunks_per_second:.1f} chunks/s){gone}")


@dataclass(frozen=True)
class Point:
    """One chunk as stored: id, payload, and the text its vector is made from."""

    id: str
    payload: dict[str, Any]
    embed_text: str  # the title, then the chunk: a chunk deep in a document still says what it is about


def point_id(source: str, text: str, occurrence: int = 0) -> str:
    """The id of the `occurrence`-th chunk with this text in `source`."""
    return str(uuid.uuid5(_NAMESPACE, f"{source}\x1f{occurrence}\x1f{text}"))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def chunk_points(documents: Sequence[Document], embedder: Embedder, config: IngestConfig,
                 root: str | None = None) -> list[Point]:
    """The points of one file's documents; `root` is the directory their source is relative to."""
    seen: Counter[tuple[str, str]] = Counter()
    points = []
    for doc in documents:
        for index, text in enumerate(chunk_text(doc.text, embedder.tokenizer, config.chunk_tokens, config.overlap)):
            # the title shares the model's window with the chunk: past it, text is never embedded
            embed_text = with_title(doc.title, text, embedder.tokenizer, embedder.max_tokens)
            payload = {"source": doc.source, "root": root, "title": doc.title, "tags": list(doc.tags),
                       "chunk_index": index, "text": text, "meta": dict(doc.meta), "line": doc.line,
                       "embed_hash": _digest(embed_text)}
            payload["fingerprint"] = _digest(json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str))
            points.append(Point(point_id(doc.source, text, seen[doc.source, text]), payload, embed_text))
            seen[doc.source, text] += 1
    return points


def _check_names(files: Sequence[SourceFile], stored: dict[str, Stored], collection: str) -> None:
    """Refuse a run that would give a file the name another file, still on disk, holds in the collection."""
    held: dict[str, set[str]] = {}
    for s in stored.values():
        if s.path is not None:
            held.setdefault(s.source, set()).add(s.path)
    in_run = {f.location for f in files}
    for f in files:
        for other in sorted(held.get(f.source, set()) - in_run):
            if os.path.lexists(other):
                raise ValueError(
                    f"{f.path} would be source {f.source!r}, which collection {collection!r} already holds from "
                    f"{other}: ingest a directory that holds both ({os.path.commonpath([f.location, other])}) "
                    f"so each keeps its own name, or ingest into another --collection")


def _owned(files: Sequence[SourceFile], stored: dict[str, Stored]) -> dict[str, dict[str, Stored]]:
    """The stored chunks each file of the run replaces, by source: those of its name, then of its path.

    A chunk of its path under another name is what a directory given over a recorded root renames.
    A chunk's id holds its name, so only the file of that name can ever write it again.
    """
    owned: dict[str, dict[str, Stored]] = {f.source: {} for f in files}
    by_location = {f.location: f.source for f in files}
    for i, s in stored.items():
        if s.source in owned:
            owned[s.source][i] = s
        elif s.path in by_location:
            owned[by_location[s.path]][i] = s
    return owned


def _gone(paths: Sequence[str | Path], stored: dict[str, Stored], owned: dict[str, dict[str, Stored]]
          ) -> dict[str, list[str]]:
    """Chunk ids by source of the files under the directories in `paths` that are no longer on disk."""
    dirs = [Path(p).resolve() for p in paths if Path(p).is_dir()]
    kept = {i for ids in owned.values() for i in ids}
    exists: dict[str, bool] = {}
    gone: dict[str, list[str]] = {}
    for i, s in stored.items():
        if i in kept or s.path is None or not any(Path(s.path).is_relative_to(d) for d in dirs):
            continue
        if not exists.setdefault(s.path, os.path.lexists(s.path)):
            gone.setdefault(s.source, []).append(i)
    return gone


class _Writer:
    """Embeds and writes points in batches; deletes a file's stale points only once its new ones are stored."""

    def __init__(self, store: Store, batch_size: int) -> None:
        self.store, self.batch_size = store, batch_size
        self.queue: list[Point] = []
        self.deletes: list[tuple[int, list[str]]] = []  # (points queued up to that file's last, its stale ids)
        self.queued = self.written = 0

    def add(self, embed: list[Point], repayload: list[Point], stale: list[str]) -> None:
        self.store.set_payloads({p.id: p.payload for p in repayload})  # no vector to wait for: now
        self.queue += embed
        self.queued += len(embed)
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
    stored = store.stored()
    files = find_files(paths, {s.root for s in stored.values() if s.root})
    _check_names(files, stored, store.name)
    owned = _owned(files, stored)
    report = IngestReport()
    writer = _Writer(store, config.batch_size)
    # disable=None: tqdm draws the bar on a terminal only, so logs and pipes stay clean
    for file in tqdm(files, desc="ingest", unit="file", disable=None if config.progress else True):
        try:
            documents = load(file.path, file.source)
        except Unreadable as e:
            report.skipped.append(Skipped(str(file.path), str(e)))
            continue
        points = chunk_points(documents, embedder, config, file.root)
        old = owned[file.source]
        embed = [p for p in points if p.id not in old or old[p.id].embed_hash != p.payload["embed_hash"]]
        repayload = [p for p in points if p.id in old and old[p.id].embed_hash == p.payload["embed_hash"]
                     and old[p.id].fingerprint != p.payload["fingerprint"]]
        keep = {p.id for p in points}
        stale = [i for i in old if i not in keep]
        report.files += 1
        report.chunks += len(points)
        report.added += sum(p.id not in old for p in embed)
        report.updated += sum(p.id in old for p in embed) + len(repayload)
        report.embedded += len(embed)
        report.removed += len(stale)
        writer.add(embed, repayload, stale)
    writer.flush()
    if config.prune:
        gone = _gone(paths, stored, owned)
        store.delete_ids([i for ids in gone.values() for i in ids])
        report.pruned = sorted(gone)
        report.removed += sum(map(len, gone.values()))
    report.seconds = time.perf_counter() - start
    return report


def open_store(config: StoreConfig, corpus: Sequence[str | Path] = (), embedder: Embedder | None = None,
               log: Callable[[str], object] = print) -> Store:
    """`config`'s store, with `corpus` (files or directories) ingested first: an index kept up to date with its
    documents, unchanged files skipped (`gatehead.retrieval.ingest`). What changed is logged."""
    store = Store(config, embedder or Embedder())
    if not corpus:
        return store
    try:
        report = ingest([Path(c) for c in corpus], store, IngestConfig(progress=False))
    except BaseException:
        store.close()
        raise
    if report.added or report.updated or report.removed:
        log(f"Index at {config.location}: {report.summary()}")
    return store
