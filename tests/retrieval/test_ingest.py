"""Ingestion on real embedded Qdrant: idempotent, replaces changed files, deletes, skips bad files, survives a crash."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gatehead.retrieval.config import IngestConfig, StoreConfig
from gatehead.retrieval.embedder import Embedder
from gatehead.retrieval.ingest import chunk_points, find_files, ingest
from gatehead.retrieval.loaders import load
from gatehead.retrieval.store import Store

GATEHEAD = str(Path(sys.executable).parent / "gatehead")
SMALL = IngestConfig(chunk_tokens=48, overlap=8, batch_size=4, progress=False)  # several chunks per file


def para(topic: str, n: int, start: int = 0) -> str:
    return " ".join(f"The {topic} guide, point {i}: check item {i} before you call support." for i in range(start,
                                                                                                          start + n))


CORPUS = {
    "warranty.md": f"# Warranty\nTags: support\n\n{para('warranty', 4)}\n\n## Claims\n{para('claims', 3)}\n",
    "guides/router.md": f"# Router\n\n{para('router', 10)}\n",
    "guides/battery.txt": f"{para('battery', 3)}\n",
    "faq.jsonl": "\n".join(json.dumps({"text": para(t, 2), "title": t.title(), "tags": ["faq"]})
                           for t in ("shipping", "payment")),
    "returns.html": f"<html><title>Returns</title><h1>Returns</h1><p>{para('returns', 4)}</p></html>",
}


def snapshot(store: Store, vectors: bool = False) -> dict[str, Any]:
    """Every point: id -> payload (and vector)."""
    points, _ = store.client.scroll(store.name, limit=10_000, with_payload=True, with_vectors=vectors)
    return {str(p.id): (p.payload, np.asarray(p.vector)) if vectors else p.payload for p in points}


def clean_ingest(root: Path, tmp_path: Path, embedder: Embedder) -> dict[str, Any]:
    with Store(StoreConfig(path=tmp_path / "clean"), embedder) as store:
        ingest([root], store, SMALL)
        return snapshot(store, vectors=True)


def test_find_files_names_sources_relative_to_the_root(write_corpus: Callable, embedder: Embedder) -> None:
    root = write_corpus({**CORPUS, ".git/config.md": "x", "guides/.draft.md": "x"})
    assert sorted(source for _, source in find_files([root])) == sorted(CORPUS)
    assert find_files([root / "guides" / "router.md", root / "guides"])[0][1] == "router.md"
    other = write_corpus({"guides/router.md": "# Other router"}, "other")
    with pytest.raises(ValueError, match="would both be source 'guides/router.md'"):
        find_files([root, other])
    with pytest.raises(ValueError, match="does not exist"):
        find_files([root / "nope"])
    with Store(StoreConfig(path=":memory:"), embedder) as store, pytest.raises(ValueError, match="lower it"):
        ingest([root], store, IngestConfig(chunk_tokens=300))


def test_reingesting_unchanged_files_adds_nothing(write_corpus: Callable, tmp_path: Path, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        first = ingest([root], store, SMALL)
        assert (first.files, first.added, first.updated, first.removed, first.skipped) == (5, first.chunks, 0, 0, [])
        assert first.chunks >= 12 and store.count() == first.chunks
        before = snapshot(store)
        again = ingest([root], store, SMALL)
        assert (again.added, again.updated, again.removed, again.unchanged) == (0, 0, 0, first.chunks)
        assert snapshot(store) == before
        assert {p["source"] for p in before.values()} == set(CORPUS)
        assert {(p["title"], tuple(p["tags"])) for p in before.values() if p["source"] == "faq.jsonl"} == {
            ("Shipping", ("faq",)), ("Payment", ("faq",))}


def test_a_changed_file_replaces_its_old_chunks(write_corpus: Callable, tmp_path: Path, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        ingest([root], store, SMALL)
        before = snapshot(store)
        (root / "guides/router.md").write_text(f"# Router\n\n{para('router', 2)} Hold reset for ten seconds.\n")
        (root / "warranty.md").write_text(CORPUS["warranty.md"].replace("Tags: support", "Tags: support, legal"))
        report = ingest([root], store, SMALL)
        after = snapshot(store)
    old_router = {i for i, p in before.items() if p["source"] == "guides/router.md"}
    new_router = {i for i, p in after.items() if p["source"] == "guides/router.md"}
    expected = {p.id for p in chunk_points(load(root / "guides/router.md", "guides/router.md"), embedder, SMALL)}
    assert new_router == expected and not old_router & new_router  # no orphans of the old version
    warranty = [i for i, p in after.items() if p["source"] == "warranty.md"]
    assert report.updated == len(warranty) and all(after[i]["tags"] == ["support", "legal"] for i in warranty)
    assert report.added == len(new_router) and report.removed == len(old_router)
    assert {i: p for i, p in after.items() if p["source"] not in ("guides/router.md", "warranty.md")} == {
        i: p for i, p in before.items() if p["source"] not in ("guides/router.md", "warranty.md")}
    assert after == {i: payload for i, (payload, _) in clean_ingest(root, tmp_path, embedder).items()}


def test_a_deleted_source_is_gone_until_ingested_again(write_corpus: Callable, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        total = ingest([root], store, SMALL).chunks
        router = store.count(["guides/router.md"])
        assert router >= 2 and store.delete_source("guides/router.md") == router
        assert store.count() == total - router and store.search("router", sources=["guides/router.md"]) == []
        assert ingest([root], store, SMALL).added == router and store.count() == total


def test_bad_files_are_skipped_and_keep_what_was_stored(write_corpus: Callable, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        total = ingest([root], store, SMALL).chunks
        battery = store.count(["guides/battery.txt"])
        (root / "guides/battery.txt").write_bytes(b"\x00\x01binary now")
        (root / "photo.png").write_bytes(b"\x89PNG")
        (root / "broken.pdf").write_bytes(b"%PDF-1.4 nothing else")
        report = ingest([root], store, SMALL)
        assert sorted((Path(s.path).name, s.reason.split(" (")[0]) for s in report.skipped) == [
            ("battery.txt", "binary file"), ("broken.pdf", "not a readable PDF"), ("photo.png", "unsupported type")]
        assert report.files == 4 and report.added == report.removed == 0
        assert store.count(["guides/battery.txt"]) == battery and store.count() == total


CRASHING_RUN = textwrap.dedent("""
    import os, sys
    from gatehead.retrieval.config import EmbedderConfig, IngestConfig, StoreConfig
    from gatehead.retrieval.embedder import Embedder
    from gatehead.retrieval.ingest import ingest
    from gatehead.retrieval.store import Store

    write, calls = Store.upsert, []
    def dying_upsert(self, ids, vectors, payloads):
        calls.append(len(ids))
        if len(calls) == int(sys.argv[3]):  # one point of this batch reaches the disk, then the process dies
            write(self, ids[:1], vectors[:1], payloads[:1])
            os._exit(3)
        write(self, ids, vectors, payloads)
    Store.upsert = dying_upsert
    store = Store(StoreConfig(path=sys.argv[1]), Embedder(EmbedderConfig(device="cpu")))
    ingest([sys.argv[2]], store, IngestConfig(chunk_tokens=48, overlap=8, batch_size=4, progress=False))
""")


@pytest.mark.parametrize("dies_in_write", [1, 2])  # before any old chunk is deleted, and after some are
def test_a_crash_mid_ingest_is_completed_by_the_next_run(write_corpus: Callable, tmp_path: Path, embedder: Embedder,
                                                         dies_in_write: int) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        ingest([root], store, SMALL)
    old = clean_ingest(root, tmp_path / "v1", embedder)
    # version 2: every file changes, so the crash lands between writing new chunks and deleting old ones
    for path in [root / "warranty.md", root / "guides/router.md", root / "guides/battery.txt"]:
        path.write_text(path.read_text().replace("point", "step"))
    (root / "faq.jsonl").write_text(CORPUS["faq.jsonl"].replace("Shipping", "Delivery"))
    new = clean_ingest(root, tmp_path / "v2", embedder)
    crashed = subprocess.run([sys.executable, "-c", CRASHING_RUN, str(tmp_path / "qdrant"), str(root),
                              str(dies_in_write)],
                             capture_output=True, text=True, timeout=300)
    assert crashed.returncode == 3, crashed.stderr
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        torn = snapshot(store)
        # every point is a whole point of one version, and every file has at least one version complete
        assert all(payload in [v[i][0] for v in (old, new) if i in v] for i, payload in torn.items())
        assert torn not in ({i: p for i, (p, _) in version.items()} for version in (old, new)), "no crash"
        for source in {p["source"] for p, _ in new.values()}:
            ids = {v: {i for i, (p, _) in version.items() if p["source"] == source} for v, version in
                   (("old", old), ("new", new))}
            assert ids["old"] <= torn.keys() or ids["new"] <= torn.keys(), source
        report = ingest([root], store, SMALL)
        assert report.added > 0 and report.removed > 0
        final = snapshot(store, vectors=True)
    assert final.keys() == new.keys()
    for i, (payload, vector) in final.items():
        assert payload == new[i][0] and np.allclose(vector, new[i][1], atol=1e-5)


def test_cli_ingest_builds_the_index_and_reports(write_corpus: Callable, tmp_path: Path, embedder: Embedder) -> None:
    root = write_corpus({**CORPUS, "logo.txt": b"\x00\x00\x00"})
    result = subprocess.run([GATEHEAD, "ingest", str(root), "--store", str(tmp_path / "qdrant"), "--chunk-tokens",
                             "48", "--overlap", "8", "--collection", "docs"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"warning: skipped 1 files:\n  {root / 'logo.txt'}: binary file" in result.stderr
    with Store(StoreConfig(path=tmp_path / "qdrant", collection="docs"), embedder) as store:
        chunks = store.count()
        assert f"5 files, 1 skipped; {chunks} chunks: {chunks} added, 0 updated, 0 removed" in result.stdout
        assert f"collection 'docs' in {tmp_path / 'qdrant'}: {chunks} chunks" in result.stdout
        again = ingest([root], store, SMALL)  # the library agrees with what the command stored
        assert (again.added, again.updated, again.removed, again.unchanged) == (0, 0, 0, chunks)
    bad = subprocess.run([GATEHEAD, "ingest", "--delete", "router.md", "--store", str(tmp_path / "qdrant"),
                          "--collection", "docs"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "a source is a path relative to the directory" in bad.stderr
    assert "'guides/router.md'" in bad.stderr
    both = subprocess.run([GATEHEAD, "ingest", str(root), "--delete", "x"], capture_output=True, text=True)
    assert both.returncode == 2 and "exactly one of the two" in both.stderr
