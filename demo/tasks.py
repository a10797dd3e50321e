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
from gatehead.demo.kb import Doc, Fact, KnowledgeBase, build_kb, category_of, invented_stems
from gatehead.demo.phrasings import (
    FOLLOW_UP_FAMILIES,
    FOLLOW_UPS_BY_ATTRIBUTE,
    families_for,
    families_in,
    family_key,
    render,
)
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


# Follow-ups as people type them: about the same product, in everyday words where an attribute has them.
_CASUAL = {"price": ["how much is it", "and what does it cost?", "price?", "how much does it cost then"],
           "weight": ["how heavy is it", "and the weight?", "what does it weigh"],
           "warranty": ["whats the warranty on it", "and the warranty?", "how long is it covered"],
           "colour": ["what colour is it", "and the colour?", "which color does it come in"]}
_ABOUT = ["and its {attr}?", "what about its {attr}", "how about the {attr}?", "and the {attr}?", "whats its {attr}",
          "ok and {attr}?", "What is its {attr}?", "{attr}?"]
_SWITCH = ["and the {name}?", "what about the {name}?", "how about {name}", "ok and the {name}", "same for the {name}?",
           "And the {name}?", "what about {name} then", "and {name}?", "the {name}?", "and for the {name}",
           "how about the {name} instead?", "ok what about the {name}", "{name} too?", "thanks, and the {name}?"]
_AFTER_REFUSAL = ["ok, {q}", "fine. {q}", "ok then {q}", "{q}", "never mind. {q}"]
_OFF_TOPIC = ["who won the world cup in 2018?", "whats the capital of canada", "how do i cook rice",
              "what is the weather in bergen tomorrow?", "can you write me a poem about tents"]
_RESET = "reset time when it "


def _typed(name: str, r: random.Random) -> str:
    """A product name as people type it: mostly as written, sometimes in lower case."""
    return name.lower() if r.random() < 0.3 else name


def standalone_question(attribute: str, name: str) -> str:
    """The standalone form of a question about a product's attribute (a reset names its fault)."""
    if attribute.startswith(_RESET):
        return f"How do I reset the {name} if it {attribute.removeprefix(_RESET)}?"
    return _CANONICAL.format(attr=attribute, name=name)


def _asked(fact: Fact, name: str, r: random.Random) -> str:
    """A first question about `fact`: the standalone form, or a training-split phrasing family's wording."""
    if r.random() < 0.4:
        return standalone_question(fact.attribute, name)
    group = families_for(fact.attribute)
    family = r.choice(families_in(group, "train"))
    return render(family, r.choice(group[family]), fact.attribute, ref=name)


def _pronoun(fact: Fact, r: random.Random) -> str:
    """A follow-up asking for `fact` of the product already in the conversation, by pronoun or not at all."""
    key = family_key(fact.attribute)
    own = FOLLOW_UPS_BY_ATTRIBUTE.get("reset" if fact.attribute.startswith(_RESET) else key, [])
    roll = r.random()
    if own and (roll < 0.4 or fact.attribute.startswith(_RESET)):
        return render("", r.choice(own), fact.attribute)
    if roll < 0.7:
        family = r.choice(families_in(FOLLOW_UP_FAMILIES, "train"))
        return render(family, r.choice(FOLLOW_UP_FAMILIES[family]), fact.attribute)
    return r.choice(_CASUAL.get(fact.attribute, []) + _ABOUT).format(attr=fact.attribute)


def _same_kind(product, fact: Fact) -> Fact | None:
    """`product`'s fact of the same attribute as `fact` (any fault, for a reset)."""
    reset = fact.attribute.startswith(_RESET)
    return next((f for f in product.facts
                 if f.attribute == fact.attribute or (reset and f.attribute.startswith(_RESET))), None)


def _follow_up(case: str, kb: KnowledgeBase, products: list, product, first, r: random.Random) -> tuple:
    """A follow-up of `case` after a question about `product`'s `first` fact: (the follow-up, its standalone
    form, the product and fact it asks about, None where the documents do not have it)."""
    target_fact, target_product = None, product
    if case in ("pronoun", "after-refusal"):
        fact = r.choice([f for f in product.facts if f is not first] or product.facts)
        follow_up = _pronoun(fact, r)
        if case == "after-refusal":
            follow_up = r.choice(_AFTER_REFUSAL).format(q=follow_up[:1].lower() + follow_up[1:])
        standalone, target_fact = standalone_question(fact.attribute, product.name), fact
    elif case == "switch":
        other = r.choice([p for p in products if p is not product and p.category == product.category] or products)
        typed = _typed(other.name, r)
        follow_up = r.choice(_SWITCH).format(name=typed)
        target_product, target_fact = other, _same_kind(other, first)
        attribute = "reset time when it " if first.attribute.startswith(_RESET) else first.attribute
        standalone = (f"How do I reset the {typed}?" if attribute == _RESET
                      else standalone_question(attribute, typed))
    elif case == "missing":
        noun = product.name.split(" ", 1)[1]
        ghost = f"{r.choice(kb.ghosts).split(' ', 1)[0]} {noun}"
        typed = _typed(ghost, r)
        follow_up = r.choice(_SWITCH).format(name=typed)
        standalone = (f"How do I reset the {typed}?" if first.attribute.startswith(_RESET)
                      else standalone_question(first.attribute, typed))
        target_product = None
    elif case == "standalone":  # a question that needs no rewrite is left as it is
        other = r.choice(products)
        target_fact = r.choice(other.facts)
        follow_up = standalone = standalone_question(target_fact.attribute, other.name)
        target_product = other
    elif case == "off-topic":
        follow_up = standalone = r.choice(_OFF_TOPIC)
        target_product = None
    else:  # by order code: searched as typed; the notice then names the product
        other = r.choice(products)
        follow_up = r.choice(_SWITCH).format(name=other.code).replace("the ", "")
        standalone, target_product = f"What is the {first.attribute} of {other.code}?", None
        if first.attribute.startswith(_RESET):
            standalone = f"How do I reset {other.code}?"
    return follow_up, standalone, target_product, target_fact


def conversation_examples(kb: KnowledgeBase, r: random.Random, count: int) -> list[LMExample]:
    """Follow-ups of every kind the agent meets, each made standalone (the rewrite task) and answered.

    One earlier exchange (a question about any fact of a product, asked as people ask it, and its cited
    answer, or a refusal), then a follow-up: about the same product by pronoun, about another product by
    name (the earlier question's attribute carried over), about a product that does not exist, after a
    refusal, off topic, by order code, or a question that needs no rewrite. The standalone question keeps
    every name as the user typed it and never adds one; the answer reads the conversation and the
    passages retrieved for the standalone question.
    """
    out: list[LMExample] = []
    products = [p for p in kb.products if p.facts]
    for _ in range(count):
        product = r.choice(products)
        first = r.choice(product.facts)
        gold = kb.by_id[first.doc_id]
        case = r.choice(("pronoun", "pronoun", "switch", "switch", "switch", "missing", "after-refusal", "off-topic",
                         "code", "standalone"))
        if case == "after-refusal":
            conversation = (Turn("user", f"Who designed the {_typed(product.name, r)}?"), Turn("assistant", REFUSAL))
        else:
            earlier = cited(first.value, (passage(gold),), f"{gold.doc_id}.md")
            conversation = (Turn("user", _asked(first, _typed(product.name, r), r)), Turn("assistant", earlier))
        follow_up, standalone, target_product, target_fact = _follow_up(case, kb, products, product, first, r)
        out.append(LMExample(REWRITE_SYSTEM, follow_up, (), standalone, conversation))
        if target_fact is not None and target_product is not None:
            docs = _context(kb, [kb.by_id[target_fact.doc_id]], set(), r, target_product.name)
            reply = cited(target_fact.value, docs, f"{target_fact.doc_id}.md")
        else:
            docs = _context(kb, [], set(), r, product.name)
            reply = REFUSAL
        if case != "code":  # an order code's answer comes after a search (the templated data has those)
            out.append(LMExample(ANSWER_SYSTEM, follow_up, docs, reply, conversation))
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
