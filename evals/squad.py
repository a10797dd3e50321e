"""SQuAD 2.0-style JSON -> gatehead's dataset format (`gatehead eval convert-squad`).

Each paragraph's context becomes one corpus document (corpus.jsonl: text, title, id); each question
one line of questions.jsonl: `answerable` (not `is_impossible`), gold `answers` (deduplicated), and,
with `fixed_documents`, its own context as the fixed document (which bypasses retrieval).
"""

from __future__ import annotations

import json
from pathlib import Path


def convert_squad(path: str | Path, out_dir: str | Path, fixed_documents: bool = False,
                  limit: int | None = None) -> tuple[Path, Path]:
    """Write `corpus.jsonl` and `questions.jsonl` into `out_dir`; returns their paths."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not SQuAD-style JSON (expected {{'data': [{{'title', 'paragraphs'}}]}}): "
                         f"{e}") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    documents, questions = [], []
    for article in data:
        title = str(article.get("title", ""))
        for p, paragraph in enumerate(article.get("paragraphs", [])):
            doc_id = f"{title}-{p}"
            context = paragraph["context"]
            documents.append({"text": context, "title": title, "id": doc_id})
            for qa in paragraph.get("qas", []):
                golds = list(dict.fromkeys(a["text"] for a in qa.get("answers", []) if a.get("text")))
                row = {"question": qa["question"], "answerable": not qa.get("is_impossible", not golds),
                       "answers": golds, "id": qa.get("id", "")}
                if fixed_documents:
                    row["documents"] = [{"text": context, "title": title, "source": doc_id}]
                questions.append(row)
            if limit is not None and len(questions) >= limit:
                break
        if limit is not None and len(questions) >= limit:
            break
    corpus, qs = out / "corpus.jsonl", out / "questions.jsonl"
    corpus.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in documents), encoding="utf-8")
    qs.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions[:limit]), encoding="utf-8")
    return corpus, qs
