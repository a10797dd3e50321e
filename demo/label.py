"""Checks every demo question's intended label against the real retriever, and keeps the ones that hold.

The corpus is ingested into a fresh embedded Qdrant store with the default embedder, then:
- `answer` holds when the first retrieval (top TOP_K) returns the document with the gold span;
- `search` holds when the first retrieval misses that document but returns the related notice,
  and the rewritten question's retrieval returns it;
- `refuse` holds by construction (no document has the answer); it is kept with what was retrieved.
Rows keep the passages as retrieved, so the gate and the model train and test on what the agent
will really see. Training questions retrieve from training documents only (a source filter on the
same index): otherwise held-out documents would reach training as distractors, and the model could
learn their facts. Validation and test questions retrieve from the whole corpus, as users do.
Questions that fail their check are counted by reason and left out.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from gatehead.demo.kb import KnowledgeBase
from gatehead.demo.tasks import TOP_K


def _rows(hits) -> list[dict]:
    return [asdict(hit.to_passage()) for hit in hits]


def label(kb: KnowledgeBase, corpus_dir: Path, questions_path: Path, out_dir: Path, prefix: str = "") -> dict:
    """Write `out_dir/{prefix}{train,val,test}.jsonl` of the questions whose retrieval matches their label
    (a split with no questions writes no file).

    `kb` is the knowledge base that wrote `corpus_dir` (it knows each document's split).
    """
    from gatehead.retrieval.config import IngestConfig, StoreConfig
    from gatehead.retrieval.embedder import Embedder
    from gatehead.retrieval.ingest import ingest
    from gatehead.retrieval.store import Store

    started = time.time()
    questions = [json.loads(line) for line in questions_path.read_text(encoding="utf-8").splitlines() if line]
    train_sources = sorted(f"{doc.doc_id}.md" for doc in kb.docs if doc.split == "train")
    embedder = Embedder()
    kept: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    dropped: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(StoreConfig(path=Path(tmp) / "qdrant", collection="demo"), embedder)
        try:
            ingest([corpus_dir], store, IngestConfig(progress=False))
            for q in questions:
                within = train_sources if q["split"] == "train" else None
                hits = store.search(q["question"], top_k=TOP_K, sources=within)
                sources = [h.source for h in hits]
                gold, related = f"{q['gold']}.md" if q["gold"] else "", f"{q['related']}.md" if q["related"] else ""
                row = {**q, "gold": gold, "related": related, "documents": _rows(hits)}
                if q["label"] == "answer" and gold not in sources:
                    dropped["answer: gold document not retrieved"] += 1
                    continue
                if q["label"] == "search":
                    if gold in sources:
                        dropped["search: first retrieval already finds the answer"] += 1
                        continue
                    if related not in sources:
                        dropped["search: first retrieval misses the related notice"] += 1
                        continue
                    found = store.search(q["rewrite"], top_k=TOP_K, sources=within)
                    if gold not in [h.source for h in found]:
                        dropped["search: the rewrite does not find the answer"] += 1
                        continue
                    row["rewrite_documents"] = _rows(found)
                if q["answer"]:
                    holder = next(h for h in hits + (found if q["label"] == "search" else []) if h.source == gold)
                    assert q["answer"] in holder.text, f"{q['qid']}: the gold span is not in its document"
                kept[q["split"]].append(row)
        finally:
            store.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in kept.items():
        if not rows:
            continue
        (out_dir / f"{prefix}{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                               encoding="utf-8")
    return {
        "questions": len(questions),
        "kept": {split: dict(Counter(r["label"] for r in rows)) for split, rows in kept.items() if rows},
        "dropped": dict(dropped),
        "seconds": round(time.time() - started, 1),
    }
