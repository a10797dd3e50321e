"""Labelled demo questions over the knowledge base: answer, refuse and search, with gold answers and rewrites.

Intended labels come from how a question refers to its entity:
- by name, about a fact its documents hold: `answer` (gold span and document given);
- by order code or former name, about a fact on the spec sheet or support article: `search` (the
  order-code notice is related but lacks the fact; `rewrite` names the product, and finds it);
- by order code or former name, about a fact on the notice itself: `answer`;
- about a product that does not exist, a fact no document holds, or the world at large: `refuse`.
`gatehead.demo.label` then checks every intended label against the real retriever and keeps only
questions whose retrieval behaves as the label says. Nothing here retrieves or writes files.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from gatehead.demo.kb import COMPANY, KnowledgeBase, Product, slug, split_of

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
