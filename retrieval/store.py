"""The Qdrant collection of chunks: opened for one embedder, written by ingestion, searched by the agent.

Embedded storage in a directory (one process at a time, held by a lock file; ":memory:" for tests)
or a Qdrant server by URL, through the same `QdrantClient` calls. A collection records the identity
of the embedder that filled it (weights fingerprint and dimension) and refuses any other, so vectors
are never mixed. Each point is one chunk: payload `text`, `source`, `root` (the directory `source` is
relative to), `title`, `tags`, `chunk_index`, `meta`, `line`, `embed_hash` (of the text its vector was
made from) and a `fingerprint` of all the rest. This module does not read files or cut text: see `ingest`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gatehead.gate.prompt import Passage
from gatehead.retrieval.config import StoreConfig
from gatehead.retrieval.embedder import Embedder

if TYPE_CHECKING:
    import numpy as np

_SCROLL = 1024
LOCK_FILE = ".gatehead.lock"


class StoreLocked(ValueError):
    """Another process (or another Store in this one) holds the embedded storage directory."""


class EmbedderMismatch(ValueError):
    """The collection was filled by another embedding model or dimension."""


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk."""

    text: str
    source: str
    title: str
    chunk_index: int
    score: float  # cosine similarity to the query
    tags: tuple[str, ...] = ()
    id: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict, hash=False)  # a JSONL record's other fields (url...)
    line: int | None = None  # the JSONL record's line number

    def to_passage(self) -> Passage:
        """The passage the gate and the answer prompt take."""
        return Passage(text=self.text, title=self.title, source=self.source, score=self.score)


@dataclass(frozen=True)
class Stored:
    """What ingestion compares a stored chunk by: no text, no vector."""

    source: str
    root: str | None  # None for a chunk stored before roots were recorded
    fingerprint: str
    embed_hash: str  # "" for a chunk stored before it was recorded

    @property
    def path(self) -> str | None:
        """The file the chunk came from, as this machine names it."""
        return f"{self.root.rstrip('/')}/{self.source}" if self.root else None


def _lock(path: Path) -> IO[bytes]:
    """An exclusive lock on embedded storage, taken before qdrant-client reads it; closing the file frees it."""
    import fcntl

    path.mkdir(parents=True, exist_ok=True)
    handle = open(path / LOCK_FILE, "ab")  # held open, and locked, for the store's lifetime
    try:
        # flock locks belong to one open file: a second Store in the same process is refused as well
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise StoreLocked(
            f"the Qdrant storage {path} is open in another process, and embedded storage serves one "
            f"process at a time: stop that process, or run a Qdrant server (docker run -p 6333:6333 "
            f"qdrant/qdrant) and give every process its address (--url / StoreConfig.url)") from None
    return handle


class Store:
    """One collection of one Qdrant storage, opened for `embedder` (None: delete and count only)."""

    def __init__(self, config: StoreConfig | None = None, embedder: Embedder | None = None) -> None:
        from qdrant_client import QdrantClient
        from qdrant_client.http.exceptions import ApiException

        config = config or StoreConfig()
        self.config, self.embedder, self.name = config, embedder, config.collection
        self._lock: IO[bytes] | None = None
        if config.url:
            self.client = QdrantClient(url=config.url, api_key=config.api_key)
        elif str(config.path) == ":memory:":
            self.client = QdrantClient(location=":memory:")
        else:
            self._lock = _lock(Path(config.path))
            try:
                self.client = QdrantClient(path=str(config.path))
            except BaseException:
                self._lock.close()
                raise
        try:
            self._open_collection()
        except ApiException as e:  # only a server answers over HTTP: unreachable, or the key refused
            self.close()
            raise ValueError(f"the Qdrant server at {config.url} failed ({e}): check that it runs at that "
                             f"address and that QDRANT_API_KEY holds its API key") from e
        except BaseException:
            self.close()
            raise

    def _open_collection(self) -> None:
        from qdrant_client import models

        if not self.client.collection_exists(self.name):
            if self.embedder is None:
                raise ValueError(f"there is no collection {self.name!r} in {self.config.location}: "
                                 f"ingest documents first (gatehead ingest PATH), or name another --collection")
            self.client.create_collection(
                self.name, vectors_config=models.VectorParams(size=self.embedder.dimension,
                                                              distance=models.Distance.COSINE),
                metadata={"gatehead": {"embedder": self.embedder.identity, "model": self.embedder.name,
                                       "dimension": self.embedder.dimension}})
            if self.config.url:  # the server filters on indexed fields; embedded storage has no indexes
                for field_name in ("source", "tags"):
                    self.client.create_payload_index(self.name, field_name, models.PayloadSchemaType.KEYWORD)
            return
        info = self.client.get_collection(self.name)
        recorded = (info.config.metadata or {}).get("gatehead")
        if not recorded:
            raise ValueError(f"collection {self.name!r} in {self.config.location} was not made by gatehead "
                             f"(it records no embedder): name another --collection")
        if self.embedder is None:
            return
        size = info.config.params.vectors.size
        fix = (f"open it with the model that filled it ({recorded['model']}), or ingest into another --collection "
               f"(or delete this one to re-ingest with {self.embedder.name})")
        if size != self.embedder.dimension:
            raise EmbedderMismatch(f"collection {self.name!r} holds {size}-dimensional vectors, but the embedding "
                                   f"model {self.embedder.name} makes {self.embedder.dimension}-dimensional ones: "
                                   + fix)
        if recorded["embedder"] != self.embedder.identity:
            raise EmbedderMismatch(f"collection {self.name!r} was filled by another embedding model "
                                   f"({recorded['model']}, {recorded['embedder']}) than {self.embedder.name} "
                                   f"({self.embedder.identity}): " + fix)

    def ping(self) -> None:
        """Raise unless the collection can be read now (a Qdrant server may have gone away)."""
        self.client.get_collection(self.name)

    def close(self) -> None:
        """Release the storage (and its lock, for embedded storage)."""
        self.client.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _filter(sources: Sequence[str] | None = None, tags: Sequence[str] | None = None) -> Any:
        from qdrant_client import models

        must = [models.FieldCondition(key=key, match=models.MatchAny(any=list(values)))
                for key, values in (("source", sources), ("tags", tags)) if values is not None]
        return models.Filter(must=must) if must else None

    def count(self, sources: Sequence[str] | None = None) -> int:
        """Chunks stored, in all (None) or the given sources."""
        if sources is not None and not sources:
            return 0
        return self.client.count(self.name, count_filter=self._filter(sources), exact=True).count

    def stored(self) -> dict[str, Stored]:
        """Every stored chunk by point id, without text or vector: what ingestion compares against."""
        stored: dict[str, Stored] = {}
        offset = None
        while True:
            points, offset = self.client.scroll(self.name, limit=_SCROLL, offset=offset, with_vectors=False,
                                                with_payload=["source", "root", "fingerprint", "embed_hash"])
            for p in points:
                stored[str(p.id)] = Stored(p.payload["source"], p.payload.get("root"), p.payload["fingerprint"],
                                           p.payload.get("embed_hash", ""))
            if offset is None:
                return stored

    def upsert(self, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[dict[str, Any]]) -> None:
        """Write points (replacing any with the same ids); returns once they are stored."""
        from qdrant_client import models

        assert len(ids) == len(vectors) == len(payloads), (len(ids), len(vectors), len(payloads))
        if ids:
            self.client.upsert(self.name, models.Batch(ids=list(ids), vectors=vectors.tolist(),
                                                       payloads=list(payloads)), wait=True)

    def set_payloads(self, payloads: Mapping[str, dict[str, Any]]) -> None:
        """Replace the payloads of stored points by id, keeping their vectors; returns once they are stored."""
        from qdrant_client import models

        if payloads:
            self.client.batch_update_points(self.name, [
                models.OverwritePayloadOperation(overwrite_payload=models.SetPayload(payload=payload, points=[i]))
                for i, payload in payloads.items()], wait=True)

    def delete_ids(self, ids: Sequence[str]) -> None:
        """Remove points by id."""
        from qdrant_client import models

        if ids:
            self.client.delete(self.name, models.PointIdsList(points=list(ids)), wait=True)

    def delete_source(self, source: str) -> int:
        """Remove every chunk of `source`; the number removed."""
        from qdrant_client import models

        removed = self.count([source])
        if removed:
            self.client.delete(self.name, models.FilterSelector(filter=self._filter([source])), wait=True)
        return removed

    def search(self, query: str, top_k: int = 5, score_threshold: float | None = None,
               sources: Sequence[str] | None = None, tags: Sequence[str] | None = None,
               dedup: float | None = 0.95) -> list[Hit]:
        """The `top_k` chunks most similar to `query`, best first.

        `score_threshold` drops chunks below that cosine similarity; `sources` and `tags` keep chunks
        with any of the given values (None: no filter; an empty list matches nothing). `dedup` drops a
        chunk whose cosine similarity to a better hit is at least that much (the same text in two
        files, say); None keeps them all. Dropped chunks are made up for from further down the ranking.
        """
        import numpy as np

        if self.embedder is None:
            raise ValueError("this store was opened without an embedder: pass one to search")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if dedup is not None and not 0 < dedup <= 1:
            raise ValueError(f"dedup is a cosine similarity in (0, 1], or None to keep near-duplicates; got {dedup}")
        if (sources is not None and not sources) or (tags is not None and not tags):
            return []
        vector = self.embedder.encode([query])[0].tolist()
        kept: list[Hit] = []
        kept_vectors: list[np.ndarray] = []
        page = top_k if dedup is None else 3 * top_k  # spares for the near-duplicates that dedup drops
        offset = 0
        while len(kept) < top_k:
            points = self.client.query_points(self.name, query=vector, limit=page, offset=offset,
                                              score_threshold=score_threshold,
                                              query_filter=self._filter(sources, tags),
                                              with_payload=True, with_vectors=dedup is not None).points
            for p in points:
                if dedup is not None:
                    v = np.asarray(p.vector)  # stored normalised: the dot product is the cosine
                    if any(float(v @ k) >= dedup for k in kept_vectors):
                        continue
                    kept_vectors.append(v)
                kept.append(Hit(text=p.payload["text"], source=p.payload["source"], title=p.payload["title"],
                                chunk_index=p.payload["chunk_index"], score=p.score, tags=tuple(p.payload["tags"]),
                                id=str(p.id), meta=p.payload.get("meta") or {}, line=p.payload.get("line")))
                if len(kept) == top_k:
                    break
            if len(points) < page:  # the ranking is exhausted
                break
            offset += page
        return kept
