"""What the demo model learns: answer from the documents, refuse politely, rewrite a question for search.

Two sources of examples, both laid out by the same prompt builder the engine uses:
- the labelled training split with the documents the real retriever returned (`gatehead.demo.label`);
- synthetic knowledge bases with made-up product names and fresh facts per seed, so the model must
  copy names and facts from its prompt rather than remember them. Their "retrieval" is the gold
  document among hard negatives (same category, same kind), shuffled.
Held-out products and policies never appear in either. This module makes examples; it trains nothing.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gatehead.agent.prompts import ANSWER_SYSTEM, REFUSAL, REWRITE_SYSTEM
from gatehead.demo.kb import Doc, KnowledgeBase, build_kb, category_of, invented_stems
from gatehead.demo.questions import Question, build_questions, phrased_questions
from gatehead.gate.data import parse_example
from gatehead.gate.prompt import Passage, Turn

TOP_K = 3  # passages per retrieval, in the demo agent and in training
_FOLLOW_UPS = ["What about its {attr}?", "And its {attr}?", "What is its {attr}?"]
_CANONICAL = "What is the {attr} of the {name}?"


@dataclass(frozen=True)
class LMExample:
    """One supervised turn: the prompt's parts and the assistant's reply."""

    system: str
    question: str
    passages: tuple[Passage, ...]
    target: str
    conversation: tuple[Turn, ...] = ()


def passage(doc: Doc, score: float = 0.0) -> Passage:
    """A document as the retriever returns it (one chunk per demo document)."""
    return Passage(text=doc.body.strip(), title=doc.title, source=f"{doc.doc_id}.md", score=score)


def cited(answer: str, passages: Sequence[Passage], gold_source: str) -> str:
    """The reply for an answerable question: the span and the number of the passage holding it."""
    number = next(i for i, p in enumerate(passages, 1) if p.source == gold_source)
    return f"{answer} [{number}]"


def strip_citations(text: str) -> str:
    return re.sub(r"\s*\[\d+\]", "", text).strip()


def normalize(text: str) -> str:
    """For exact match: citations, case, surrounding punctuation and spacing do not count."""
    return " ".join(strip_citations(text).lower().strip(" .!?").split())


def from_record(record: dict) -> list[LMExample]:
    """Examples from one labelled question with its actually retrieved documents (`label` output)."""
    docs = parse_example(record, record.get("qid", "record")).passages
    question, label = record["question"], record["label"]
    out = []
    if label == "answer":
        out.append(LMExample(ANSWER_SYSTEM, question, docs, cited(record["answer"], docs, record["gold"])))
    else:
        out.append(LMExample(ANSWER_SYSTEM, question, docs, REFUSAL))
    if label == "search":
        out.append(LMExample(REWRITE_SYSTEM, question, docs, record["rewrite"]))
        found = parse_example({"question": record["rewrite"], "documents": record["rewrite_documents"],
                               "label": "answer"}, record.get("qid", "record")).passages
        out.append(LMExample(ANSWER_SYSTEM, record["rewrite"], found, cited(record["answer"], found, record["gold"])))
    return out


def _context(kb: KnowledgeBase, must: Sequence[Doc], avoid: set[str], r: random.Random,
             about: str | None = None) -> tuple[Passage, ...]:
    """`must` plus hard negatives up to TOP_K, shuffled.

    By default the negatives are documents of the same kind about other entities (70%) or any
    documents. With `about` (the question's product, or a product that does not exist) they are
    mostly of the same kind about other products of its category, as the real retriever returns them
    ("How heavy is the Rowan Lantern?" gets the Larch and Sorrel Lanterns' spec sheets beside the
    Rowan's): 65% of held-out test prompts hold two passages of one category, 11% of the default
    synthetic ones do. With `about` and `must` empty every passage is such a negative.
    """
    kind = must[0].doc_id.split("/")[0] if must else "products"
    taken = {d.entity for d in must} | ({about} if about else set())
    same = [d for d in kb.docs if d.doc_id.split("/")[0] == kind and d.entity not in taken and d.doc_id not in avoid]
    category = category_of(about) if about else None
    namesakes = [d for d in same if category is not None and category_of(d.entity) == category]
    other = [d for d in kb.docs if d.doc_id not in avoid and d not in must]
    picked = list(must)
    while len(picked) < TOP_K:
        if about is None:
            pool = same if same and r.random() < 0.7 else other
        else:
            roll = r.random()
            pool = namesakes if namesakes and roll < 0.7 else same if same and roll < 0.85 else other
        doc = r.choice(pool)
        if doc not in picked:
            picked.append(doc)
    r.shuffle(picked)
    return tuple(passage(d) for d in picked)


def synthetic_examples(kb: KnowledgeBase, questions: Sequence[Question], r: random.Random,
                       same_category: bool = False) -> list[LMExample]:
    """Examples for every question of a synthetic knowledge base, with shuffled hard-negative contexts.

    `same_category`: negatives mostly about products of the question's category (see `_context`).
    """
    out: list[LMExample] = []

    def context(must: Sequence[Doc], avoid: set[str], q: Question) -> tuple[Passage, ...]:
        return _context(kb, must, avoid, r, q.entity if same_category else None)

    products = {p.name: p for p in kb.products}
    for q in questions:
        if q.label == "answer":
            gold = kb.by_id[q.gold]
            docs = context([gold], set(), q)
            out.append(LMExample(ANSWER_SYSTEM, q.question, docs, cited(q.answer, docs, f"{q.gold}.md")))
            if q.kind == "name" and r.random() < 0.15:  # the rewrite leaves a question that needs none as it is
                out.append(LMExample(REWRITE_SYSTEM, q.question, docs, q.question))
        elif q.label == "search":
            docs = context([kb.by_id[q.related]], {q.gold}, q)
            out.append(LMExample(ANSWER_SYSTEM, q.question, docs, REFUSAL))
            out.append(LMExample(REWRITE_SYSTEM, q.question, docs, q.rewrite))
        else:
            own = [d for d in kb.docs if d.entity == q.entity and d.doc_id.startswith("products/")]
            if same_category:  # a product that does not exist gets its category's spec sheets
                docs = context(own, set(), q)
            else:
                docs = context(own or [r.choice(kb.docs)], set(), q)
            out.append(LMExample(ANSWER_SYSTEM, q.question, docs, REFUSAL))
    # Follow-ups: made standalone before retrieval, then answered with the conversation in the prompt.
    for q in questions:
        if q.kind != "name" or r.random() > 0.2:
            continue
        product = products[q.entity]
        fact = r.choice([f for f in product.facts if f.doc_id.startswith("products/")])
        first = LMExample(ANSWER_SYSTEM, q.question, (), "")
        gold = kb.by_id[q.gold]
        earlier = cited(q.answer, (passage(gold),), f"{q.gold}.md")
        conversation = (Turn("user", first.question), Turn("assistant", earlier))
        follow_up = r.choice(_FOLLOW_UPS).format(attr=fact.attribute)
        standalone = _CANONICAL.format(attr=fact.attribute, name=product.name)
        out.append(LMExample(REWRITE_SYSTEM, follow_up, (), standalone, conversation))
        docs = context([kb.by_id[fact.doc_id]], set(), q)
        out.append(LMExample(ANSWER_SYSTEM, follow_up, docs, cited(fact.value, docs, f"{fact.doc_id}.md"),
                             conversation))
    return out


def training_examples(records: Sequence[dict], knowledge_bases: int, seed: int,
                      same_category: bool = False, wide_names: bool = False,
                      phrasings: bool = False, exclude: frozenset[str] = frozenset()) -> list[LMExample]:
    """Real-retrieval examples from `records` plus `knowledge_bases` synthetic ones, shuffled.

    `wide_names`: the synthetic products' names take every shape `invented_stems(wide=True)` draws.
    `phrasings`: each synthetic knowledge base is also asked in the training phrasing families, with
    fresh out-of-scope messages (`phrased_questions(family_split="train")`); val and test families and
    messages never appear. Questions in `exclude` (the hand-typed test set) are never asked.
    """
    r = random.Random(seed)
    out = [e for record in records for e in from_record(record)]
    for i in range(knowledge_bases):
        stems = invented_stems(random.Random(f"{seed}-{i}"), 80, wide_names)
        kb = build_kb(seed=1000 + seed * 100 + i, products=40, stems=stems[:60], ghost_stems=stems[60:],
                      policies=False)
        questions = [q for q in build_questions(kb, seed=i) if q.kind != "world"]
        if phrasings:  # out-of-scope messages are the same few in every knowledge base: a tenth of them each
            phrased = phrased_questions(kb, seed=seed * 1000 + i, family_split="train", per_fact=1, drawn=4)
            questions += [q for q in phrased if q.question not in exclude
                          and (not q.family.startswith("out-of-scope.") or r.random() < 0.1)]
        out += synthetic_examples(kb, questions, r, same_category)
    r.shuffle(out)
    return out
