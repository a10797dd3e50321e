"""The Qdrant collection of chunks: opened for one embedder, written by ingestion, searched by the agent.

Embedded storage in a directory (one process at a time; ":memory:" for tests) or a Qdrant server by
URL, through the same `QdrantClient` calls. A collection records the identity of the embedder that
filled it (weights fingerprint and dimension) and refuses any other, so vectors are never mixed.
Each point is one chunk: payload `text`, `source`, `title`, `tags`, `chunk_index`, `meta` and a
`fingerprint` of the rest. This module does not read files or cut text: see `ingest`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gatehead.gate.prompt import Passage
from gatehead.retrieval.config import StoreConfig
from gatehead.retrieval.embedder import Embedder

if TYPE_CHECKING:
    import numpy as np

_SCROLL = 1024


class StoreLocked(ValueError):
    """Another process holds the embedded storage directory."""


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

    def to_passage(self) -> Passage:
        """The passage the gate and the answer prompt take."""
        return Passage(text=self.text, title=self.title, source=self.source, score=self.score)


class Store:
    """One collection of one Qdrant storage, opened for `embedder` (None: delete and count only)."""

    def __init__(self, config: StoreConfig | None = None, embedder: Embedder | None = None) -> None:
        from qdrant_client import QdrantClient
        from qdrant_client.http.exceptions import ApiException

        config = config or StoreConfig()
        self.config, self.embedder, self.name = config, embedder, config.collection
        if config.url:
            self.client = QdrantClient(url=config.url, api_key=config.api_key)
        else:
            try:
                self.client = QdrantClient(path=str(config.path))  # ":memory:" too
            except RuntimeError as e:
                if "already accessed" not in str(e):
                    raise
                raise StoreLocked(
                    f"the Qdrant storage {config.path} is open in another process, and embedded storage serves one "
                    f"process at a time: stop that process, or run a Qdrant server (docker run -p 6333:6333 "
                    f"qdrant/qdrant) and give every process its address (--url / StoreConfig.url)") from None
        try:
            self._open_collection()
        except ApiException as e:  # only a server answers over HTTP: unreachable, or the key refused
            self.client.close()
            raise ValueError(f"the Qdrant server at {config.url} failed ({e}): check that it runs at that "
                             f"address and that QDRANT_API_KEY holds its API key") from e
        except BaseException:
            self.client.close()
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
                for field in ("source", "tags"):
                    self.client.create_payload_index(self.name, field, models.PayloadSchemaType.KEYWORD)
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

    def close(self) -> None:
        """Release the storage (and its lock, for embedded storage)."""
        self.client.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _filter(sources: Sequence[str] | None = None, tags: Sequence[str] | None = None) -> Any:
        from qdrant_client import models

        must = [models.FieldCondition(key=key, match=models.MatchAny(any=list(values)))
                for key, values in (("source", sources), ("tags", tags)) if values]
        return models.Filter(must=must) if must else None

    def count(self, sources: Sequence[str] | None = None) -> int:
        """Chunks stored, in all or the given sources."""
        return self.client.count(self.name, count_filter=self._filter(sources), exact=True).count

    def fingerprints(self) -> dict[str, dict[str, str]]:
        """Every stored chunk's payload fingerprint by point id, by source: what ingestion compares against."""
        stored: dict[str, dict[str, str]] = {}
        offset = None
        while True:
            points, offset = self.client.scroll(self.name, limit=_SCROLL, offset=offset,
                                                with_payload=["source", "fingerprint"], with_vectors=False)
            for p in points:
                stored.setdefault(p.payload["source"], {})[str(p.id)] = p.payload["fingerprint"]
            if offset is None:
                return stored

    def upsert(self, ids: Sequence[str], vectors: np.ndarray, payloads: Sequence[dict[str, Any]]) -> None:
        """Write points (replacing any with the same ids); returns once they are stored."""
        from qdrant_client import models

        assert len(ids) == len(vectors) == len(payloads), (len(ids), len(vectors), len(payloads))
        if ids:
            self.client.upsert(self.name, models.Batch(ids=list(ids), vectors=vectors.tolist(),
                                                       payloads=list(payloads)), wait=True)

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
        with any of the given values. `dedup` drops a chunk whose cosine similarity to a better hit is
        at least that much (the same text in two files, say); None keeps them all.
        """
        import numpy as np

        if self.embedder is None:
            raise ValueError("this store was opened without an embedder: pass one to search")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if dedup is not None and not 0 < dedup <= 1:
            raise ValueError(f"dedup is a cosine similarity in (0, 1], or None to keep near-duplicates; got {dedup}")
        vector = self.embedder.encode([query])[0]
        # near-duplicates are dropped after the search, so ask for spares to still fill top_k
        limit = top_k if dedup is None else 3 * top_k
        points = self.client.query_points(self.name, query=vector.tolist(), limit=limit,
                                          score_threshold=score_threshold, query_filter=self._filter(sources, tags),
                                          with_payload=True, with_vectors=dedup is not None).points
        kept: list[Hit] = []
        kept_vectors: list[np.ndarray] = []
        for p in points:
            if dedup is not None:
                v = np.asarray(p.vector)  # stored normalised: the dot product is the cosine
                if any(float(v @ k) >= dedup for k in kept_vectors):
                    continue
                kept_vectors.append(v)
            kept.append(Hit(text=p.payload["text"], source=p.payload["source"], title=p.payload["title"],
                            chunk_index=p.payload["chunk_index"], score=p.score, tags=tuple(p.payload["tags"]),
                            id=str(p.id)))
            if len(kept) == top_k:
                break
        return kept
