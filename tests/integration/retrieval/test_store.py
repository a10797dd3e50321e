"""The Qdrant store on real embedded storage: search, filters, dedup, metadata, embedder identity, and the lock."""

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
from gatehead.retrieval.store import LOCK_FILE, EmbedderMismatch, Store, StoreLocked

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


def test_filters_combine_and_an_empty_list_matches_nothing(store: Store) -> None:
    assert [h.source for h in store.search("warranty", sources=["warranty.md", "router.md", "battery.md"],
                                           tags=["support"])] == ["warranty.md", "battery.md"]
    assert store.search("warranty", sources=["router.md"], tags=["support"]) == []
    # an empty list is "none of these", not "no filter": a caller that narrowed its sources to none gets none
    assert store.search("warranty", sources=[]) == [] and store.search("warranty", tags=[]) == []
    assert store.count([]) == 0 and store.count() == 4


def test_dedup_drops_near_identical_chunks(store: Store) -> None:
    deduped = [h.source for h in store.search("How long is the warranty?", top_k=3)]
    # one copy of the warranty text gives way to the next distinct chunk
    assert deduped[0] in ("warranty.md", "copy/warranty.md") and deduped[1:] == ["battery.md", "router.md"]
    with pytest.raises(ValueError, match="dedup is a cosine similarity"):
        store.search("warranty", dedup=1.5)


def test_dedup_still_fills_top_k_past_many_copies(store: Store) -> None:
    copies = [Document(DOCS[0].text, f"mirror/{i}.md", "Warranty") for i in range(12)]
    fill(store, copies)  # 14 copies of the warranty text rank above everything else
    hits = store.search("How long is the warranty?", top_k=3)
    assert len(hits) == 3 and [h.source for h in hits[1:]] == ["battery.md", "router.md"]
    assert hits[0].text == DOCS[0].text and len({h.id for h in hits}) == 3


def test_a_score_threshold_and_dedup_together(store: Store) -> None:
    # both warranty copies pass 0.5 and nothing else does; dedup keeps one, and the search ends there
    hits = store.search("How long is the warranty?", top_k=5, score_threshold=0.5)
    assert len(hits) == 1 and hits[0].source in ("warranty.md", "copy/warranty.md") and hits[0].score > 0.5
    assert len(store.search("How long is the warranty?", top_k=5, score_threshold=0.5, dedup=None)) == 2
    assert store.search("How long is the warranty?", top_k=5, score_threshold=0.99) == []


def test_hits_carry_record_metadata(store: Store) -> None:
    record = Document("Order status is on the account page.", "faq.jsonl", "Orders", ("faq",),
                      {"url": "https://example.com/orders", "line": "L7"}, line=3)
    fill(store, [record])
    (hit,) = store.search("Where do I see my order status?", top_k=1, sources=["faq.jsonl"])
    assert hit.meta == {"url": "https://example.com/orders", "line": "L7"} and hit.line == 3
    assert store.search("warranty", top_k=1)[0].meta == {} and store.search("warranty", top_k=1)[0].line is None


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


def test_a_second_process_on_embedded_storage_is_told_to_use_a_server(tmp_path: Path, store: Store,
                                                                     gatehead_cli: str) -> None:
    args = [gatehead_cli, "ingest", "--delete", "router.md", "--store", str(tmp_path / "qdrant")]
    locked = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert locked.returncode == 2
    assert "is open in another process" in locked.stderr and "--url" in locked.stderr
    with pytest.raises(StoreLocked, match="run a Qdrant server"):  # in one process too: one client per directory
        Store(StoreConfig(path=tmp_path / "qdrant"))
    store.close()
    freed = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert freed.returncode == 0 and freed.stdout.strip() == "deleted router.md: 1 chunks", freed.stderr


HOLD_LOCK = """
import fcntl, sys, time
handle = open(sys.argv[1], "ab")
fcntl.flock(handle, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def test_the_lock_is_taken_before_qdrant_opens_the_storage(tmp_path: Path, store: Store) -> None:
    store.close()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "qdrant" / LOCK_FILE)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        fresh = Embedder(EmbedderConfig(device="cpu"))
        # gatehead's own lock refuses the second opener, before the storage is read or a model is loaded
        with pytest.raises(StoreLocked, match="is open in another process.*--url"):
            Store(StoreConfig(path=tmp_path / "qdrant"), fresh)
        assert "model" not in vars(fresh)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    with Store(StoreConfig(path=tmp_path / "qdrant")) as reopened:  # released with the holder
        assert reopened.count() == 4


def test_an_unreachable_server_is_named(embedder: Embedder) -> None:
    with pytest.raises(ValueError, match=r"Qdrant server at http://127.0.0.1:9 failed .*check that it runs"):
        Store(StoreConfig(url="http://127.0.0.1:9"), embedder)
