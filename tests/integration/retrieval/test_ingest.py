"""Ingestion on real embedded Qdrant: idempotent, replaces changed files, prunes removed ones, keeps names apart,
skips bad files, survives a crash."""

from __future__ import annotations

import json
import os
import shutil
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
from gatehead.retrieval.ingest import chunk_points, ingest
from gatehead.retrieval.loaders import Document, load
from gatehead.retrieval.store import Store

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


def sources(store: Store) -> dict[str, int]:
    """Chunks stored per source."""
    counts: dict[str, int] = {}
    for payload in snapshot(store).values():
        counts[payload["source"]] = counts.get(payload["source"], 0) + 1
    return counts


def test_chunks_are_cut_to_fit_the_model_window_with_their_title(embedder: Embedder) -> None:
    title = " ".join(f"Chapter{i} of the very long handbook" for i in range(20))  # ~120 tokens
    text = " ".join(f"Rule {i}: check the seal and the valve before you start." for i in range(60))
    points = chunk_points([Document(text, "rules.md", title)], embedder, IngestConfig())
    assert len(points) >= 3
    for p in points:
        n = len(embedder.tokenizer(p.embed_text, add_special_tokens=False)["input_ids"])
        # the chunk is whole and first in line; the title gives way, down to the room the chunk leaves
        assert n <= embedder.max_tokens and p.embed_text.endswith("\n" + p.payload["text"])
        assert title.startswith(p.embed_text.split("\n")[0]) and p.payload["title"] == title
    assert any(len(p.embed_text.split("\n")[0]) < len(title) for p in points)
    with Store(StoreConfig(path=":memory:"), embedder) as store, pytest.raises(ValueError, match="lower it"):
        ingest([], store, IngestConfig(chunk_tokens=300))


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
    assert report.embedded == len(new_router)  # the warranty's new tags are written without re-embedding
    assert {i: p for i, p in after.items() if p["source"] not in ("guides/router.md", "warranty.md")} == {
        i: p for i, p in before.items() if p["source"] not in ("guides/router.md", "warranty.md")}
    assert after == {i: payload for i, (payload, _) in clean_ingest(root, tmp_path, embedder).items()}


def test_a_payload_change_keeps_the_vector(write_corpus: Callable, embedder: Embedder,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"text": f"Answer {i}: the part number is P-{i:03d}.", "title": f"Part {i}", "url": f"/p/{i}"}
               for i in range(20)]
    root = write_corpus({"parts.jsonl": "\n".join(map(json.dumps, records))})
    embedded: list[str] = []
    encode = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda texts: embedded.extend(texts) or encode(texts))
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        assert ingest([root], store, SMALL).embedded == len(embedded) == 20
        before = snapshot(store, vectors=True)
        embedded.clear()
        # a record on top: every other record's line (and so its payload) changes, none of its embedded text
        new = {"text": "Answer 99: the part number is P-099.", "title": "Part 99"}
        (root / "parts.jsonl").write_text("\n".join(map(json.dumps, [new, *records])))
        report = ingest([root], store, SMALL)
        assert (report.added, report.updated, report.removed, report.embedded) == (1, 20, 0, 1)
        assert embedded == ["Part 99\nAnswer 99: the part number is P-099."]
        after = snapshot(store, vectors=True)
        for i, (payload, vector) in before.items():
            assert after[i][1].tolist() == vector.tolist() and after[i][0]["line"] == payload["line"] + 1
        assert {p["meta"]["url"] for p, _ in after.values() if p["meta"]} == {f"/p/{i}" for i in range(20)}
        # a new title changes what is embedded: that record is embedded again
        records[3]["title"] = "Part three"
        (root / "parts.jsonl").write_text("\n".join(map(json.dumps, [new, *records])))
        report = ingest([root], store, SMALL)
        assert (report.added, report.updated, report.embedded, report.unchanged) == (0, 1, 1, 20)


def test_repeated_chunks_in_a_file_are_stored_once_each(write_corpus: Callable, embedder: Embedder) -> None:
    note = f"## Note\n{para('note', 2)}"
    text = f"# Notes\n\n{para('intro', 2)}\n\n{note}\n\n{note}\n\n## Other\n{para('other', 2)}\n\n{note}\n"
    root = write_corpus({"notes.md": text})
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        first = ingest([root], store, SMALL)
        texts = [p["text"] for p in snapshot(store).values()]
        assert first.added == first.chunks == len(texts) == 5 and texts.count(note) == 3
        again = ingest([root], store, SMALL)
        assert (again.added, again.updated, again.removed, again.unchanged) == (0, 0, 0, 5)
        (root / "notes.md").write_text(text.replace(f"{note}\n\n{note}", note))  # one copy fewer
        fewer = ingest([root], store, SMALL)
        # the occurrence in each id: the copies left keep theirs, the last one goes, positions shift
        assert (fewer.added, fewer.removed, fewer.embedded) == (0, 1, 0) and fewer.updated > 0
        assert [p["text"] for p in snapshot(store).values()].count(note) == 2 and store.count() == 4


def test_a_file_emptied_loses_all_its_chunks(write_corpus: Callable, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        total = ingest([root], store, SMALL).chunks
        router = store.count(["guides/router.md"])
        (root / "guides/router.md").write_text("# Router\n")  # a title, no text: no chunks
        report = ingest([root], store, SMALL)
        assert (report.files, report.removed, report.added, report.pruned) == (5, router, 0, [])
        assert store.count(["guides/router.md"]) == 0 and store.count() == total - router


def test_files_gone_from_a_directory_are_pruned(write_corpus: Callable, tmp_path: Path, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        ingest([root], store, SMALL)
        counts = sources(store)
        (root / "guides/battery.txt").unlink()
        (root / "returns.html").rename(root / "refunds.html")
        kept = ingest([root], store, IngestConfig(**{**vars(SMALL), "prune": False}))
        assert (kept.removed, kept.pruned) == (0, []) and "guides/battery.txt" in sources(store)
        report = ingest([root], store, SMALL)
        assert report.pruned == ["guides/battery.txt", "returns.html"]
        assert report.removed == counts["guides/battery.txt"] + counts["returns.html"] and report.added == 0
        assert "gone from disk: guides/battery.txt, returns.html" in report.summary()
        assert set(sources(store)) == {"warranty.md", "guides/router.md", "faq.jsonl", "refunds.html"}
        # a directory inside the root prunes under itself only
        (root / "warranty.md").unlink()
        (root / "guides/router.md").unlink()
        sub = ingest([root / "guides"], store, SMALL)
        assert sub.pruned == ["guides/router.md"] and set(sources(store)) == {"warranty.md", "faq.jsonl",
                                                                              "refunds.html"}
        after = snapshot(store)
    assert {i: p for i, p in after.items() if p["source"] != "warranty.md"} == {
        i: p for i, (p, _) in clean_ingest(root, tmp_path, embedder).items()}


def test_another_root_cannot_take_a_name(write_corpus: Callable, tmp_path: Path, embedder: Embedder) -> None:
    first = write_corpus({"README.md": "# A\n\nThe first manual.", "guides/x.md": "# X\n\nGuide x."}, "kb/a")
    second = write_corpus({"README.md": "# B\n\nThe second manual."}, "kb/b")
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        ingest([first], store, SMALL)
        before = snapshot(store)
        with pytest.raises(ValueError, match=rf"{second / 'README.md'} would be source 'README.md', which collection "
                                             rf"'gatehead' already holds from {first.resolve() / 'README.md'}: "
                                             rf"ingest a directory that holds both \({tmp_path.resolve() / 'kb'}\)"):
            ingest([second], store, SMALL)
        # a file of a recorded root, given alone, keeps the name it has there
        alone = ingest([first / "guides" / "x.md"], store, SMALL)
        assert (alone.files, alone.added, alone.unchanged) == (1, 0, 1) and snapshot(store) == before
        # their common parent names both apart, and takes the first root's chunks over under new names
        both = ingest([tmp_path / "kb"], store, SMALL)
        assert sources(store) == {"a/README.md": 1, "a/guides/x.md": 1, "b/README.md": 1}
        assert (both.added, both.removed) == (3, 2)
        assert store.search("manual", top_k=5, sources=["README.md"]) == []


def test_a_file_given_first_is_renamed_by_its_directory(write_corpus: Callable, embedder: Embedder) -> None:
    root = write_corpus({"guides/x.md": "# X\n\nGuide x.", "guides/y.md": "# Y\n\nGuide y."})
    with Store(StoreConfig(path=":memory:"), embedder) as store:
        ingest([root / "guides" / "x.md"], store, SMALL)
        assert ingest([root / "guides" / "y.md"], store, SMALL).added == 1
        assert sources(store) == {"x.md": 1, "y.md": 1}
        report = ingest([root], store, SMALL)
        assert sources(store) == {"guides/x.md": 1, "guides/y.md": 1} and (report.added, report.removed) == (2, 2)


def test_a_moved_tree_keeps_its_vectors(write_corpus: Callable, tmp_path: Path, embedder: Embedder) -> None:
    root = write_corpus(CORPUS)
    with Store(StoreConfig(path=tmp_path / "qdrant"), embedder) as store:
        first = ingest([root], store, SMALL)
        moved = Path(shutil.move(root, tmp_path / "moved"))
        report = ingest([moved], store, SMALL)
        # the old root is gone from disk: its names pass to the new one, payloads rewritten, nothing embedded
        assert (report.added, report.updated, report.removed, report.embedded) == (0, first.chunks, 0, 0)
        assert {p["root"] for p in snapshot(store).values()} == {moved.resolve().as_posix()}


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


def test_cli_ingest_builds_the_index_and_reports(write_corpus: Callable, tmp_path: Path, embedder: Embedder,
                                                 gatehead_cli: str) -> None:
    root = write_corpus({**CORPUS, "logo.txt": b"\x00\x00\x00"})
    # a server's key in the environment is no business of local storage
    result = subprocess.run([gatehead_cli, "ingest", str(root), "--store", str(tmp_path / "qdrant"), "--chunk-tokens",
                             "48", "--overlap", "8", "--collection", "docs"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "QDRANT_API_KEY": "server-key"})
    assert result.returncode == 0, result.stderr
    assert f"warning: skipped 1 files:\n  {root / 'logo.txt'}: binary file" in result.stderr
    with Store(StoreConfig(path=tmp_path / "qdrant", collection="docs"), embedder) as store:
        chunks = store.count()
        assert f"5 files, 1 skipped; {chunks} chunks: {chunks} added, 0 updated, 0 removed" in result.stdout
        assert f"collection 'docs' in {tmp_path / 'qdrant'}: {chunks} chunks" in result.stdout
        again = ingest([root], store, SMALL)  # the library agrees with what the command stored
        assert (again.added, again.updated, again.removed, again.unchanged) == (0, 0, 0, chunks)
        returns = store.count(["returns.html"])
    (root / "returns.html").unlink()
    pruned = subprocess.run([gatehead_cli, "ingest", str(root), "--store", str(tmp_path / "qdrant"), "--chunk-tokens",
                             "48", "--overlap", "8", "--collection", "docs"], capture_output=True, text=True,
                            timeout=300)
    assert pruned.returncode == 0, pruned.stderr
    assert f"0 added, 0 updated, {returns} removed" in pruned.stdout and "gone from disk: returns.html" in pruned.stdout
    bad = subprocess.run([gatehead_cli, "ingest", "--delete", "router.md", "--store", str(tmp_path / "qdrant"),
                          "--collection", "docs"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "a source is a path relative to the directory" in bad.stderr
    assert "'guides/router.md'" in bad.stderr
    both = subprocess.run([gatehead_cli, "ingest", str(root), "--delete", "x"], capture_output=True, text=True)
    assert both.returncode == 2 and "exactly one of the two" in both.stderr
