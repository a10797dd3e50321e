"""The Qdrant store on real embedded storage: search, filters, dedup, embedder identity, and the lock."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gatehead.gate.prompt import Passage
from gatehead.gate.weights import read_headers
from gatehead.retrieval.config import EmbedderConfig, IngestConfig, StoreConfig
from gatehead.retrieval.embedder import Embedder
from gatehead.retrieval.ingest import chunk_points
from gatehead.retrieval.loaders import Document
from gatehead.retrieval.store import EmbedderMismatch, Store, StoreLocked

GATEHEAD = str(Path(sys.executable).parent / "gatehead")
DOCS = [
    Document("The warranty covers defects for two years from the date of purchase.", "warranty.md", "Warranty",
             ("support",)),
    Document("To reset the router, hold the reset button for ten seconds.", "router.md", "Router", ("network",)),
    Document("The battery lasts about 500 full charge cycles.", "battery.md", "Battery", ("power", "support")),
    Document("The warranty covers defects for two years from the date of purchase.", "copy/warranty.md", "Warranty"),
]


def fill(store: Store, docs: list[Document] = DOCS) -> None:
    points = chunk_points(docs, store.embedder, IngestConfig())
    store.upsert([p.id for p in points], store.embedder.encode([p.embed_text for p in points]),
                 [p.payload for p in points])


@pytest.fixture
def store(tmp_path: Path, embedder: Embedder) -> Store:
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        fill(store)
        yield store


def test_search_ranks_filters_and_converts_to_passages(store: Store) -> None:
    hits = store.search("How long is the warranty?", top_k=10, dedup=None)
    # the two copies embed the same text: equal scores, in either order
    assert {h.source for h in hits[:2]} == {"warranty.md", "copy/warranty.md"} and hits[0].score == hits[1].score
    assert [h.source for h in hits[2:]] == ["battery.md", "router.md"]
    assert hits[1].score > 0.5 > 0.2 > hits[2].score > hits[3].score
    assert hits[0].chunk_index == 0 and hits[0].title == "Warranty" and hits[0].text == DOCS[0].text
    assert hits[0].to_passage() == Passage(DOCS[0].text, "Warranty", hits[0].source, hits[0].score)
    assert [h.source for h in store.search("warranty", sources=["router.md", "battery.md"])] == [
        "battery.md", "router.md"]
    assert [h.source for h in store.search("warranty", tags=["support"])] == ["warranty.md", "battery.md"]
    assert store.search("warranty", tags=["nothing-has-this"]) == []
    assert [h.source for h in store.search("How long is the warranty?", top_k=10, score_threshold=0.2,
                                           dedup=None)] == [h.source for h in hits[:2]]
    assert len(store.search("How long is the warranty?", top_k=1)) == 1


def test_dedup_drops_near_identical_chunks(store: Store) -> None:
    deduped = [h.source for h in store.search("How long is the warranty?", top_k=3)]
    # one copy of the warranty text gives way to the next distinct chunk
    assert deduped[0] in ("warranty.md", "copy/warranty.md") and deduped[1:] == ["battery.md", "router.md"]
    with pytest.raises(ValueError, match="dedup is a cosine similarity"):
        store.search("warranty", dedup=1.5)


def test_storage_persists_and_deletes_by_source(tmp_path: Path, embedder: Embedder, store: Store) -> None:
    store.close()
    with Store(StoreConfig(path=tmp_path / "qdrant")) as reopened:  # no embedder: count and delete only
        assert reopened.count() == 4 and reopened.count(["router.md", "battery.md"]) == 2
        assert reopened.delete_source("router.md") == 1 and reopened.delete_source("router.md") == 0
        with pytest.raises(ValueError, match="opened without an embedder"):
            reopened.search("router")
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as again:
        assert again.count() == 3 and "router.md" not in {h.source for h in again.search("reset", top_k=10)}
    with pytest.raises(ValueError, match="no collection 'other'.*gatehead ingest PATH"):
        Store(StoreConfig(path=tmp_path / "qdrant", collection="other"))


def test_a_collection_of_another_dimension_is_refused(tmp_path: Path, embedder: Embedder) -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(tmp_path / "qdrant"))
    client.create_collection("gatehead", vectors_config=models.VectorParams(size=768, distance=models.Distance.COSINE),
                             metadata={"gatehead": {"embedder": "sha256:abc|dim=768", "model": "mpnet",
                                                    "dimension": 768}})
    client.create_collection("foreign", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    client.close()
    with pytest.raises(EmbedderMismatch, match=r"holds 768-dimensional vectors, but .* makes 384-dimensional.*"
                                               r"\(mpnet\), or ingest into another --collection"):
        Store(StoreConfig(path=tmp_path / "qdrant"), embedder)
    with pytest.raises(ValueError, match="'foreign' .* was not made by gatehead"):
        Store(StoreConfig(path=tmp_path / "qdrant", collection="foreign"), embedder)


def test_a_collection_filled_by_other_weights_is_refused(tmp_path: Path, embedder: Embedder) -> None:
    source = embedder.model_dir
    moved, tuned = tmp_path / "moved-copy", tmp_path / "tuned"
    shutil.copytree(source, moved)
    shutil.copytree(source, tuned)
    first = read_headers(tuned / "model.safetensors")[0]
    with open(tuned / "model.safetensors", "r+b") as f:  # one weight changes, as any fine-tune would change it
        f.seek(first.start)
        byte = f.read(1)
        f.seek(first.start)
        f.write(bytes([byte[0] ^ 0x01]))
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        fill(store, DOCS[:1])
    # the identity follows the weights, not where they lie
    with Store(StoreConfig(path=tmp_path / "qdrant"), Embedder(EmbedderConfig(model=moved, device="cpu"))) as same:
        assert same.count() == 1
    other = Embedder(EmbedderConfig(model=tuned, device="cpu"))
    assert other.identity != embedder.identity and other.dimension == embedder.dimension
    with pytest.raises(EmbedderMismatch, match="filled by another embedding model"):
        Store(StoreConfig(path=tmp_path / "qdrant"), other)


def test_a_second_process_on_embedded_storage_is_told_to_use_a_server(tmp_path: Path, store: Store) -> None:
    args = [GATEHEAD, "ingest", "--delete", "router.md", "--store", str(tmp_path / "qdrant")]
    locked = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert locked.returncode == 2
    assert "is open in another process" in locked.stderr and "--url" in locked.stderr
    with pytest.raises(StoreLocked, match="run a Qdrant server"):  # in one process too: one client per directory
        Store(StoreConfig(path=tmp_path / "qdrant"))
    store.close()
    freed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert freed.returncode == 0 and freed.stdout.strip() == "deleted router.md: 1 chunks", freed.stderr


def test_an_unreachable_server_is_named(embedder: Embedder) -> None:
    with pytest.raises(ValueError, match=r"Qdrant server at http://127.0.0.1:9 failed .*check that it runs"):
        Store(StoreConfig(url="http://127.0.0.1:9"), embedder)
