"""Held-out figures of the demo model and gate, on (question, actually retrieved documents) pairs.

Gate: decisions at the adapter's thresholds, accuracy and per-class recall. Model: exact match of
answers on answerable questions (citations, case and end punctuation ignored), exact match of the
rewrite on search questions, and how often it refuses where the documents lack the answer.
Runs through the HF reference (fp32), on CUDA or CPU; the shared engine's agreement with it is
checked elsewhere (`gatehead.evals.agreement`).

`evaluate_sets` gives the figures of each evaluation set of a split (`SETS`): the two templates per
attribute ("template"), people's phrasings in families training never saw ("phrased"), messages out
of the knowledge base's scope ("out_of_scope": tasks, arithmetic, gibberish, injections, other
languages, world questions) and, on test only, the questions typed by hand ("handwritten").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from gatehead.agent.prompts import ANSWER_SYSTEM, REFUSAL, REWRITE_SYSTEM
from gatehead.demo.tasks import normalize
from gatehead.gate.data import parse_example
from gatehead.gate.metrics import classification_metrics
from gatehead.gate.policy import LABELS, decide_all
from gatehead.gate.prompt import PromptBuilder, PromptConfig

MAX_REPLY = 32


def _replies(reference, builder: PromptBuilder, items: Sequence[tuple[str, Sequence]]) -> list[str]:
    prompts = [builder.build(question, passages).answer for question, passages in items]
    outputs = reference.generate(prompts, MAX_REPLY)
    eos = reference.tokenizer.eos_token_id
    return [reference.tokenizer.decode(out[:out.index(eos)] if eos in out else out) for out in outputs]


def evaluate(model_dir: str | Path, adapter_dir: str | Path, records: Sequence[dict], device: str = "cpu",
             max_context: int = 2048, answers: bool = True) -> dict:
    """Figures for `records` (rows written by `gatehead.demo.label`); see the module docstring.
    `answers=False`: the gate's figures alone (the model's replies, which the gate does not change, are
    not generated)."""
    from gatehead.gate.reference import HFReference

    reference = HFReference(model_dir, adapter_dir, dtype="float32", device=device)
    adapter = reference.adapter
    assert adapter is not None
    examples = [parse_example(r, f"record {r.get('qid', i)}") for i, r in enumerate(records)]
    gate_builder = PromptBuilder(reference.tokenizer, adapter.spec.suffix, PromptConfig(max_context=max_context))
    probs = reference.gate_probs([gate_builder.build(e.question, e.passages).gate for e in examples])
    decisions = decide_all(probs.tolist(), adapter.spec.thresholds)
    gate = classification_metrics([LABELS.index(e.label) for e in examples], [LABELS.index(d) for d in decisions])
    if not answers:
        return {"questions": len(records), "gate": asdict(gate),
                "decision_mix": {label: decisions.count(label) for label in LABELS}}

    answer_builder = PromptBuilder(reference.tokenizer, adapter.spec.suffix,
                                   PromptConfig(max_context=max_context, system=ANSWER_SYSTEM))
    rewrite_builder = PromptBuilder(reference.tokenizer, adapter.spec.suffix,
                                    PromptConfig(max_context=max_context, system=REWRITE_SYSTEM))
    answerable = [(r, e) for r, e in zip(records, examples, strict=True) if e.label == "answer"]
    searches = [(r, e) for r, e in zip(records, examples, strict=True) if e.label == "search"]
    refusals = [(r, e) for r, e in zip(records, examples, strict=True) if e.label == "refuse"]
    answers = _replies(reference, answer_builder, [(e.question, e.passages) for _, e in answerable])
    rewrites = _replies(reference, rewrite_builder, [(e.question, e.passages) for _, e in searches])
    refused = _replies(reference, answer_builder, [(e.question, e.passages) for _, e in refusals])
    answer_hits = [normalize(a) == normalize(r["answer"]) for a, (r, _) in zip(answers, answerable, strict=True)]
    rewrite_hits = [normalize(a) == normalize(r["rewrite"]) for a, (r, _) in zip(rewrites, searches, strict=True)]
    refusal_hits = [a.strip() == REFUSAL for a in refused]
    hits = {id(r): hit for (r, _), hit in zip(answerable, answer_hits, strict=True)}

    def by(key: str) -> dict:
        return _grouped(key, records, examples, decisions, hits)

    misses = [{"question": r["question"], "gold": r["answer"], "reply": a}
              for a, (r, _), hit in zip(answers, answerable, answer_hits, strict=True) if not hit]
    return {
        "questions": len(records),
        "gate": asdict(gate),
        "decision_mix": {label: decisions.count(label) for label in LABELS},
        "answer_exact_match": sum(answer_hits) / max(len(answer_hits), 1),
        "answerable": len(answer_hits),
        "rewrite_exact_match": sum(rewrite_hits) / max(len(rewrite_hits), 1),
        "refusal_rate_on_refuse": sum(refusal_hits) / max(len(refusal_hits), 1),
        "by_kind": {kind: {k: v for k, v in figures.items() if k in ("questions", "gate_accuracy")}
                    for kind, figures in by("kind").items()},
        **({"by_family": by("family")} if records and all(r.get("family") for r in records) else {}),
        # Answer exact match by the gold document's type (products, orders, support, policies).
        "by_document": {kind: {"answerable": len(got), "answer_exact_match": sum(got) / len(got)}
                        for kind, got in _by_document(answerable, answer_hits).items()},
        "answer_misses": misses[:20],
    }


def _grouped(key: str, records: Sequence[dict], examples: Sequence, decisions: Sequence[str],
             hits: dict[int, bool]) -> dict:
    """Gate accuracy (and answer exact match where answerable) per value of the records' `key`."""
    groups: dict[str, list] = {}
    for r, e, d in zip(records, examples, decisions, strict=True):
        groups.setdefault(r[key], []).append((r, d == e.label))
    out = {}
    for value, rows in sorted(groups.items()):
        out[value] = {"questions": len(rows), "gate_accuracy": sum(ok for _, ok in rows) / len(rows)}
        answered = [hits[id(r)] for r, _ in rows if id(r) in hits]
        if answered:
            out[value] |= {"answerable": len(answered), "answer_exact_match": sum(answered) / len(answered)}
    return out


def _by_document(answerable: Sequence[tuple[dict, object]], hits: Sequence[bool]) -> dict[str, list[bool]]:
    groups: dict[str, list[bool]] = {}
    for (r, _), hit in zip(answerable, hits, strict=True):
        groups.setdefault(str(r.get("gold") or "-").split("/")[0], []).append(hit)
    return dict(sorted(groups.items()))


SETS = ("template", "phrased", "out_of_scope", "handwritten")


def evaluation_sets(data_dir: str | Path, split: str, measuring: tuple[Path, Path | None] | None = None
                    ) -> dict[str, list[dict]]:
    """The labelled rows of each evaluation set of `split` ("val" or "test"); "handwritten" is test only.
    Test is read only to measure `measuring` (model, gate adapter), through `demo.sealed.unseal`."""
    if split not in ("val", "test"):
        raise ValueError(f"evaluation sets are held out: split must be 'val' or 'test', got {split!r}")
    if split == "test" and measuring is None:
        raise ValueError("the test split is read only to measure a model: pass the model and adapter measured")
    from gatehead.demo.sealed import unseal
    from gatehead.demo.splits import read_jsonl

    def read(path: Path) -> list[dict]:
        return read_jsonl(unseal(path, *measuring) if split == "test" else path)

    data_dir = Path(data_dir)
    phrased = read(data_dir / f"phrased-{split}.jsonl")
    sets = {"template": read(data_dir / f"{split}.jsonl"),
            "phrased": [r for r in phrased if not r["family"].startswith("out-of-scope.")],
            "out_of_scope": [r for r in phrased if r["family"].startswith("out-of-scope.")]}
    if split == "test":
        sets["handwritten"] = read(data_dir / "handwritten-test.jsonl")
    return sets


def evaluate_sets(model_dir: str | Path, adapter_dir: str | Path, data_dir: str | Path, split: str,
                  device: str = "cpu", max_context: int = 2048, sets: Sequence[str] = SETS,
                  answers: bool = True) -> dict:
    """`evaluate` on each evaluation set of `split` named in `sets` (see the module docstring)."""
    unknown = set(sets) - set(SETS)
    if unknown:
        raise ValueError(f"unknown evaluation sets {sorted(unknown)}; choose from {list(SETS)}")
    rows = evaluation_sets(data_dir, split, (Path(model_dir), Path(adapter_dir)))
    return {name: evaluate(model_dir, adapter_dir, rows[name], device=device, max_context=max_context,
                           answers=answers) for name in sets if name in rows}
