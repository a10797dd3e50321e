"""Labelled demo questions over the knowledge base: answer, refuse and search, with gold answers and rewrites.

Intended labels come from how a question refers to its entity:
- by name, about a fact its documents hold: `answer` (gold span and document given);
- by order code or former name, about a fact on the spec sheet or support article: `search` (the
  order-code notice is related but lacks the fact; `rewrite` names the product, and finds it);
- by order code or former name, about a fact on the notice itself: `answer`;
- about a product that does not exist, a fact no document holds, or the world at large: `refuse`.
`build_questions` asks with the two templates per attribute above (the committed model's training
questions and its "template" test set); `phrased_questions` asks in the phrasing families of
`gatehead.demo.phrasings`, held out by family as entities are by split, and adds the out-of-scope
messages. `gatehead.demo.label` then checks every intended label against the real retriever and
keeps only questions whose retrieval behaves as the label says. Nothing here retrieves or writes files.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gatehead.demo import phrasings
from gatehead.demo.kb import COMPANY, SPLITS, KnowledgeBase, Product, slug, split_of

# Per attribute: ways to ask about `{ref}` (a product reference). Unlisted attributes use _GENERIC.
_ASK = {
    "price": ["How much does the {ref} cost?", "What is the price of the {ref}?"],
    "weight": ["How heavy is the {ref}?", "What does the {ref} weigh?"],
    "warranty": ["How long is the warranty on the {ref}?", "What warranty comes with the {ref}?"],
    "colour": ["What colour is the {ref}?", "Which colour does the {ref} come in?"],
    "launch year": ["When was the {ref} introduced?", "In which year did the {ref} launch?"],
    "shipping time": ["How quickly does the {ref} ship?", "How long does the {ref} take to ship to dealers?"],
    "warehouse": ["Which warehouse ships the {ref}?", "Where does the {ref} ship from?"],
    "reset": ["How long do I hold the button to reset my {ref}?", "My {ref} {fault}. How do I reset it?"],
    "capacity": ["How many people fit in the {ref}?", "What is the capacity of the {ref}?"],
    "volume": ["How many litres does the {ref} hold?", "What is the volume of the {ref}?"],
}
_GENERIC = ["What is the {attr} of the {ref}?", "Tell me the {attr} of the {ref}."]
# Facts no document holds, for any product.
_UNKNOWN = ["Who designed the {ref}?", "Is the {ref} made in Norway?", "Does the {ref} come with a carrying case?",
            "How many units of the {ref} were sold last year?", "What is the {ref}'s recycled content?"]
# Facts of other categories: asked about a product that has no such attribute.
_FOREIGN = ["brightness", "comfort rating", "boil time", "filter life", "maximum load", "water resistance"]
_POLICY_ASK = ["What is the {attr} at {company}?", "Can you tell me the {attr}?"]
_WORLD = """Who painted the Mona Lisa? | What is the capital of Canada? | How do I bake sourdough bread?
| What is the boiling point of water at sea level? | Who won the 2018 football World Cup? | How far is the Moon?
| What is the euro to dollar exchange rate today? | Who wrote Pride and Prejudice? | How do I file my taxes?
| What is the tallest mountain in Africa? | How many bones are in the human body? | What is photosynthesis?
| Which planet is closest to the Sun? | How do I change a car tyre? | What is the population of Japan?
| Who invented the telephone? | What language is spoken in Brazil? | How do vaccines work?
| What is the speed of light? | When did the Berlin Wall fall? | How do I learn to play the guitar?
| What is the stock price of Fjordline Outdoor today? | Who is the CEO of Fjordline Outdoor?
| What will the weather be in Bergen tomorrow? | How many employees does Fjordline Outdoor have?
| What is the best pizza topping? | How do I reset my Wi-Fi router? | What is the chemical symbol for gold?
| Which ocean is the largest? | How do I cook rice? | What is the recipe for pancakes?
| Who discovered penicillin? | How long is a marathon? | What is the square root of 144?
| What is the capital of Australia? | How do I renew my passport? | What causes the northern lights?
| Which team won the last Tour de France? | How do I write a cover letter? | What is inflation?
| How many moons does Jupiter have? | Who composed the Four Seasons? | What is machine learning?
| What is the longest river in Europe? | How do I treat a bee sting? | What time zone is Norway in?
| Who was the first person on the Moon? | How many players are on a handball team?
| What is the opening time of the Oslo opera house? | How do I get a fishing licence in Sweden?
| What does a kilowatt hour cost in Germany? | Which airline flies from Bergen to London?
| What is the melting point of iron? | How tall is the Eiffel Tower? | Who wrote the Odyssey?
| What year was the first iPhone released? | What is the largest desert in the world?
| How do I bleed a radiator? | Where is the nearest hospital?""".replace("\n", " ")


@dataclass(frozen=True)
class Question:
    """One labelled question; `gold` holds the answer, `related` the notice a search question first finds."""

    qid: str
    question: str
    label: str  # intended: "answer" | "refuse" | "search"
    kind: str  # how it was made: name, code, former, notice, unknown, foreign, ghost, policy, world
    split: str
    entity: str = ""
    answer: str = ""
    gold: str = ""  # doc_id holding the answer
    related: str = ""  # search: doc_id the first retrieval should find
    rewrite: str = ""  # search: the reformulated question that finds `gold`
    family: str = ""  # the phrasing family (`gatehead.demo.phrasings`); "" for the templates above

    def to_dict(self) -> dict:
        return asdict(self)


def _asks(attribute: str) -> list[str]:
    key = "reset" if attribute.startswith("reset time") else attribute
    return _ASK.get(key, _GENERIC)


def _ask(template: str, attribute: str, ref: str) -> str:
    fault = attribute.removeprefix("reset time when it ") if attribute.startswith("reset time") else ""
    return template.format(ref=ref, attr=attribute, fault=fault)


def product_questions(product: Product, r: random.Random) -> list[Question]:
    """Every question about one product: by name, by code and former name, and unanswerable ones."""
    out: list[Question] = []
    notice = next(f.doc_id for f in product.facts if f.attribute == "warehouse")
    refs = [("code", product.code)] + ([("former", product.former_name)] if product.former_name else [])

    def add(question: str, label: str, kind: str, **extra) -> None:
        qid = f"{product.slug}-{len(out)}"
        out.append(Question(qid, question, label, kind, product.split, product.name, **extra))

    for fact in product.facts:
        templates = _asks(fact.attribute)
        for template in templates:
            add(_ask(template, fact.attribute, product.name), "answer", "name", answer=fact.value, gold=fact.doc_id)
        for kind, ref in refs:
            template = r.choice(templates)
            asked = _ask(template, fact.attribute, ref)
            if fact.doc_id == notice:  # the notice names the code and former name: answerable at once
                add(asked, "answer", "notice", answer=fact.value, gold=fact.doc_id)
            else:
                add(asked, "search", kind, answer=fact.value, gold=fact.doc_id, related=notice,
                    rewrite=_ask(template, fact.attribute, product.name))
    for template in r.sample(_UNKNOWN, 2):
        add(template.format(ref=product.name), "refuse", "unknown")
    own = {f.attribute for f in product.facts}
    foreign = r.choice([a for a in _FOREIGN if a not in own])
    add(_ask(r.choice(_GENERIC), foreign, product.name), "refuse", "foreign")
    return out


def build_questions(kb: KnowledgeBase, seed: int = 0) -> list[Question]:
    """All labelled questions for `kb`, in a fixed order for a fixed seed."""
    r = random.Random(seed)
    out: list[Question] = []
    for product in kb.products:
        out += product_questions(product, r)
    for policy in kb.policies:
        for n, fact in enumerate(policy.facts):
            for m, template in enumerate(_POLICY_ASK):
                question = template.format(attr=fact.attribute, company=COMPANY)
                out.append(Question(f"{slug(policy.name)}-{n}-{m}", question, "answer", "policy", policy.split,
                                    policy.name, answer=fact.value, gold=fact.doc_id))
    ghosts = list(kb.ghosts)
    for i, ghost in enumerate(ghosts):
        split = split_of(i, len(ghosts))
        for n, attribute in enumerate(r.sample(["price", "weight", "warranty", "colour"], 2)):
            question = _ask(r.choice(_asks(attribute)), attribute, ghost)
            out.append(Question(f"ghost-{slug(ghost)}-{n}", question, "refuse", "ghost", split, ghost))
    world = [q.strip() for q in _WORLD.split("|")]
    order = r.sample(range(len(world)), len(world))
    for rank, i in enumerate(order):
        out.append(Question(f"world-{i}", world[i], "refuse", "world", split_of(rank, len(world))))
    return out


def _phrased(fid: str, group: dict[str, list[str]], attribute: str, ref: str, r: random.Random) -> str:
    return phrasings.render(fid, r.choice(group[fid]), attribute, ref)


def phrased_product_questions(product: Product, split: str, r: random.Random, per_fact: int = 2) -> list[Question]:
    """Questions about one product in the phrasing families of `split`: `per_fact` families per fact by
    name, one by order code and former name each, two facts no document holds, one foreign attribute."""
    out: list[Question] = []
    notice = next(f.doc_id for f in product.facts if f.attribute == "warehouse")
    refs = [("code", product.code)] + ([("former", product.former_name)] if product.former_name else [])

    def add(question: str, label: str, kind: str, family: str, **extra) -> None:
        qid = f"{product.slug}-p{len(out)}"
        out.append(Question(qid, question, label, kind, product.split, product.name, family=family, **extra))

    for fact in product.facts:
        group = phrasings.families_for(fact.attribute)
        fids = phrasings.families_in(group, split)
        for fid in r.sample(fids, min(per_fact, len(fids))):
            add(_phrased(fid, group, fact.attribute, product.name, r), "answer", "name", fid,
                answer=fact.value, gold=fact.doc_id)
        for kind, ref in refs:
            fid = r.choice(fids)
            template = r.choice(group[fid])
            asked = phrasings.render(fid, template, fact.attribute, ref)
            if fact.doc_id == notice:
                add(asked, "answer", "notice", fid, answer=fact.value, gold=fact.doc_id)
            else:
                add(asked, "search", kind, fid, answer=fact.value, gold=fact.doc_id, related=notice,
                    rewrite=phrasings.render(fid, template, fact.attribute, product.name))
    unknown = phrasings.families_in(phrasings.UNKNOWN_FAMILIES, split)
    for fid in r.sample(unknown, 2):
        add(_phrased(fid, phrasings.UNKNOWN_FAMILIES, "", product.name, r), "refuse", "unknown", fid)
    own = {f.attribute for f in product.facts}
    foreign = r.choice([a for a in _FOREIGN if a not in own])
    fid = r.choice(phrasings.families_in(phrasings.FAMILIES[phrasings.GENERIC], split))
    add(_phrased(fid, phrasings.FAMILIES[phrasings.GENERIC], foreign, product.name, r), "refuse", "foreign", fid)
    return out


def phrased_questions(kb: KnowledgeBase, seed: int = 0, family_split: str | None = None, per_fact: int = 2,
                      drawn: int = 0) -> list[Question]:
    """Questions in people's phrasings about `kb`, and out-of-scope messages, in a fixed order for a seed.

    Each entity is asked in the phrasing families of its own split, so a held-out family is asked only
    about held-out entities; with `family_split` every entity is asked in that split's families (a
    synthetic knowledge base that trains: "train"). Out-of-scope messages (tasks, arithmetic, gibberish,
    injections, other languages, world questions) of each split, or of `family_split` only, are
    `refuse`, with `drawn` fresh gibberish and arithmetic messages per split.
    """
    r = random.Random(f"phrased-{seed}")
    out: list[Question] = []
    for product in kb.products:
        out += phrased_product_questions(product, family_split or product.split, r, per_fact)
    for policy in kb.policies:
        split = family_split or policy.split
        fids = phrasings.families_in(phrasings.POLICY_FAMILIES, split)
        for n, fact in enumerate(policy.facts):
            asked = [(fid, phrasings.render(fid, r.choice(phrasings.POLICY_FAMILIES[fid]), fact.attribute))
                     for fid in r.sample(fids, min(per_fact, len(fids)))]
            natural = phrasings.POLICY_BY_ATTRIBUTE.get(fact.attribute)
            if natural:
                asked.append(("policy.natural", r.choice(natural)))
            for m, (fid, question) in enumerate(asked):
                out.append(Question(f"{slug(policy.name)}-{n}-p{m}", question, "answer", "policy", policy.split,
                                    policy.name, answer=fact.value, gold=fact.doc_id, family=fid))
    ghosts = list(kb.ghosts)
    for i, ghost in enumerate(ghosts):
        split = split_of(i, len(ghosts))
        for n, attribute in enumerate(r.sample(["price", "weight", "warranty", "colour"], 2)):
            group = phrasings.families_for(attribute)
            fid = r.choice(phrasings.families_in(group, family_split or split))
            out.append(Question(f"ghost-{slug(ghost)}-p{n}", _phrased(fid, group, attribute, ghost, r), "refuse",
                                "ghost", split, ghost, family=fid))
    for split in [family_split] if family_split else SPLITS:
        for n, (kind, message) in enumerate(phrasings.out_of_scope(split, drawn, seed)):
            out.append(Question(f"{kind}-{split}-{n}", message, "refuse", kind, split, family=f"out-of-scope.{kind}"))
    return out


_HANDWRITTEN_KINDS = {"name", "code", "former", "notice", "policy", "unknown", "foreign", "ghost", "world",
                      *phrasings.OUT_OF_SCOPE}


def handwritten_questions(kb: KnowledgeBase, rows: Sequence[dict]) -> list[Question]:
    """The hand-written set (`demo/handwritten.jsonl`: question, label, kind, entity, attribute, answer,
    typed by people about held-out products and policies) as labelled questions of the test split.

    An answerable row's gold document is the one holding its entity's fact; a search row (by order code
    or former name) relates to the order-code notice and is rewritten to name the product. Rows that
    name no such fact, or a value its document does not hold, fail with the row's number.
    """
    facts = {(p.name, f.attribute): (f, p) for p in kb.products for f in p.facts}
    facts.update({(p.name, f.attribute): (f, None) for p in kb.policies for f in p.facts})
    out = []
    for n, row in enumerate(rows, 1):
        where = f"handwritten row {n} ({row.get('question', '')!r})"
        label, kind = row.get("label"), row.get("kind")
        if label not in ("answer", "search", "refuse") or kind not in _HANDWRITTEN_KINDS:
            raise ValueError(f"{where}: label {label!r} / kind {kind!r} is not one the demo knows")
        extra: dict[str, str] = {}
        if label != "refuse":
            found = facts.get((row["entity"], row["attribute"]))
            if found is None:
                raise ValueError(f"{where}: {row['entity']!r} has no fact {row['attribute']!r}")
            fact, product = found
            if fact.value != row["answer"]:
                raise ValueError(f"{where}: the documents say {fact.value!r}, the row {row['answer']!r}")
            extra = {"answer": fact.value, "gold": fact.doc_id}
            if label == "search":
                if product is None:
                    raise ValueError(f"{where}: a search row asks about a product")
                extra["related"] = next(f.doc_id for f in product.facts if f.attribute == "warehouse")
                extra["rewrite"] = _ask(_asks(fact.attribute)[0], fact.attribute, product.name)
        out.append(Question(f"handwritten-{n}", row["question"], label, kind, "test", row.get("entity", ""),
                            family="handwritten", **extra))
    return out
