"""The demo knowledge base: Fjordline Outdoor's products, order codes, support articles and policies, seeded.

`build_kb(seed)` returns the same documents and facts for the same seed. Every product is one entity
with three documents (spec sheet, order-code notice, support article); policies are entities of their
own. Each entity belongs to one split, so held-out questions are about documents and products the
model never saw in training. Facts carry the exact span that answers them. Questions live in
`gatehead.demo.questions`; this module writes no files.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

SPLITS = ("train", "val", "test")
SPLIT_SHARES = (0.7, 0.15, 0.15)
COMPANY = "Fjordline Outdoor"

# Name stems: every product gets its own, so a held-out product shares no name with a trained one.
_STEMS = """Aurora Tundra Fjord Glacier Ember Summit Cobalt Harbor Willow Granite Lumen Boreal Cedar Polar Ridge
Solstice Drift Kestrel Osprey Talus Vesper Nimbus Strata Alder Juniper Halo Quartz Sable Tarn Zenith Birch Cirrus
Dune Falcon Garnet Heron Iris Jasper Krill Larch Moraine Nordic Onyx Pika Quill Raven Sorrel Thistle Umber Vale
Wren Yarrow Azure Basalt Canyon Delta Echo Flint Gale Hollow Indigo Juno Kelp Lynx Marten Nova Orca Pine Rook
Slate Tide Ursa Vortex Wolf Alpine Bramble Comet Dawn Elder Frost Grouse Husky Icefall Jet Kodiak Lichen Meadow
Nebula Otter Peak Rowan Spruce Timber Upland Violet""".split()
# Stems for products that do not exist: out-of-scope questions that sound in scope.
_GHOST_STEMS = """Mistral Sirocco Tempest Harmattan Chinook Bora Zephyr Monsoon Squall Typhoon Levante Foehn
Williwaw Haboob Pampero Etesian Khamsin Simoom Tramontane Buran""".split()


def invented_stems(r: random.Random, count: int, wide: bool = False) -> list[str]:
    """`count` made-up name stems ("Valomir", "Teska"): synthetic products whose names cannot be remembered.

    By default the stems begin with one of 21 consonant onsets. `wide` also draws the other shapes of
    real names: one syllable ("Jet"), a vowel first ("Azure", "Otter"), c, j, qu, w, y and clusters such
    as ch, cl, fl, sh, th ("Cobalt", "Quill", "Wren"), and more endings (-t, -ll, -lt, -x, -ck). Held-out
    names have those shapes too; a model trained only on the narrow ones refused nearly every question
    about some of them (see docs/demo-model-history.md).
    """
    onsets, vowels, codas = "b d f g h k l m n p r s t v z br dr gr kr st tr sk".split(), "a e i o u ai ei".split(), \
        ["", "", "n", "r", "l", "s", "m"]
    if wide:
        onsets += "c j qu w y bl ch cl cr fl fr gl pl pr sh sl sp th".split()
        vowels += "ou ea".split()
        codas += "t ll lt x ck nd st".split()
    real = {s.lower() for s in _STEMS + _GHOST_STEMS}
    out: set[str] = set()
    while len(out) < count:
        syllables = r.choice((1, 2, 2, 3) if wide else (2, 2, 3))
        word = r.choice(vowels) if wide and r.random() < 0.25 else ""  # a vowel-initial name
        word += "".join(r.choice(onsets) + r.choice(vowels) for _ in range(syllables - bool(word))) + r.choice(codas)
        if word not in real and len(word) >= 3:
            out.add(word.capitalize())
    return sorted(out)


@dataclass(frozen=True)
class Fact:
    """One answerable fact: asked with `attribute`, answered by `value` (a span of the document)."""

    attribute: str
    value: str
    doc_id: str


@dataclass(frozen=True)
class Doc:
    """One knowledge-base document, written as `demo/corpus/<doc_id>.md`."""

    doc_id: str  # e.g. "products/aurora-lantern"
    title: str
    body: str
    entity: str
    split: str

    def markdown(self) -> str:
        return f"# {self.title}\n\n{self.body.strip()}\n"


@dataclass(frozen=True)
class Product:
    """A product entity: its name, order code, former name (if any) and facts."""

    name: str
    category: str
    code: str
    former_name: str | None
    split: str
    facts: tuple[Fact, ...] = ()

    @property
    def slug(self) -> str:
        return slug(self.name)


@dataclass(frozen=True)
class Policy:
    """A policy entity: one document and its facts."""

    name: str
    split: str
    facts: tuple[Fact, ...] = ()


@dataclass(frozen=True)
class KnowledgeBase:
    docs: tuple[Doc, ...]
    products: tuple[Product, ...]
    policies: tuple[Policy, ...]
    ghosts: tuple[str, ...]  # product names that are in no document
    seed: int
    by_id: dict[str, Doc] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.by_id.update({d.doc_id: d for d in self.docs})


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# Category: (noun, description, specific attributes as (attribute, value maker)).
def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}" if n == 1 else f"{n} {unit}s"


def _hours(r: random.Random) -> str:
    return f"{r.randrange(6, 61)} hours"


_CATEGORIES: dict[str, tuple[str, str, tuple[tuple[str, object], ...]]] = {
    "lantern": ("Lantern", "a rechargeable camping lantern", (
        ("battery life", _hours), ("brightness", lambda r: f"{r.randrange(10, 100) * 10} lumens"))),
    "headlamp": ("Headlamp", "a lightweight headlamp for trail running and climbing", (
        ("battery life", _hours), ("brightness", lambda r: f"{r.randrange(15, 120) * 10} lumens"))),
    "tent": ("Tent", "a backpacking tent", (
        ("capacity", lambda r: f"{r.randrange(2, 5)} people"),
        ("waterproof rating", lambda r: f"{r.randrange(15, 50) * 100} mm"))),
    "backpack": ("Backpack", "a hiking backpack", (
        ("volume", lambda r: f"{r.randrange(18, 76)} litres"),
        ("back length", lambda r: f"{r.randrange(40, 56)} cm"))),
    "sleeping bag": ("Sleeping Bag", "a three-season sleeping bag", (
        ("comfort rating", lambda r: f"{r.randrange(-15, 11)} °C"),
        ("fill", lambda r: r.choice(["duck down", "goose down", "synthetic fibre", "recycled polyester"])))),
    "stove": ("Stove", "a compact camping stove", (
        ("boil time", lambda r: f"{r.randrange(2, 7)} minutes {r.randrange(0, 6) * 10} seconds"),
        ("fuel", lambda r: r.choice(["isobutane", "white gas", "alcohol", "wood"])))),
    "jacket": ("Jacket", "a waterproof shell jacket", (
        ("waterproof rating", lambda r: f"{r.randrange(10, 31)},000 mm"),
        ("fabric", lambda r: r.choice(["three-layer nylon", "two-layer polyester", "recycled nylon ripstop"])))),
    "water filter": ("Water Filter", "a portable water filter", (
        ("filter life", lambda r: f"{r.randrange(5, 60) * 100} litres"),
        ("flow rate", lambda r: f"{r.randrange(5, 30) / 10:.1f} litres per minute"))),
    "watch": ("GPS Watch", "a GPS sports watch", (
        ("battery life", _hours), ("water resistance", lambda r: f"{r.randrange(3, 11) * 10} metres"))),
    "kayak": ("Kayak", "a touring kayak", (
        ("length", lambda r: f"{r.randrange(30, 55) / 10:.1f} metres"),
        ("maximum load", lambda r: f"{r.randrange(9, 18) * 10} kg"))),
}
_COLOURS = ["forest green", "slate grey", "glacier blue", "ember orange", "charcoal", "sand", "midnight navy",
            "moss", "signal red", "arctic white"]
_WAREHOUSES = ["Bergen", "Trondheim", "Tromsø", "Stavanger", "Oslo"]
_FAULTS = [("will not switch on", "power button"), ("does not charge", "reset button"),
           ("shows an error light", "mode button"), ("loses its settings", "menu button")]
_INTROS = ["is {desc} from {company}'s {year} range.", "is {desc}, introduced by {company} in {year}.",
           "joined the {company} catalogue in {year} as {desc}."]


def category_of(name: str) -> str | None:
    """The category a product name belongs to by its noun ("Rowan Lantern" -> "lantern"), or None."""
    return next((category for category, (noun, _, _) in _CATEGORIES.items() if name.endswith(f" {noun}")), None)


def split_of(index: int, count: int) -> str:
    """Deterministic split by position in a shuffled list: the first 70% train, then val, then test."""
    cut_train = round(count * SPLIT_SHARES[0])
    cut_val = cut_train + round(count * SPLIT_SHARES[1])
    return "train" if index < cut_train else "val" if index < cut_val else "test"


def _code(r: random.Random, used: set[str]) -> str:
    while True:
        code = f"{r.choice('BCDFGHJKLMNPRSTVWXZ')}{r.choice('BCDFGHJKLMNPRSTVWXZ')}-{r.randrange(100, 1000)}"
        if code not in used:
            used.add(code)
            return code


def _product_docs(r: random.Random, name: str, category: str, split: str, codes: set[str],
                  former: str | None) -> tuple[Product, list[Doc]]:
    noun, desc, specific = _CATEGORIES[category]
    code = _code(r, codes)
    year = str(r.randrange(2016, 2026))
    spec_id, order_id, support_id = f"products/{slug(name)}", f"orders/{slug(code)}", f"support/{slug(name)}"
    specs = [("price", f"€{r.randrange(3, 90) * 5 - 1}"),
             ("weight", f"{r.randrange(8, 200) * 10} g" if category not in ("kayak",) else f"{r.randrange(14, 30)} kg"),
             ("warranty", _plural(r.randrange(1, 6), "year")),
             ("colour", r.choice(_COLOURS))]
    specs += [(attr, make(r)) for attr, make in specific]
    intro = r.choice(_INTROS).format(desc=desc, company=COMPANY, year=year)
    lines = "\n".join(f"- {attr.capitalize()}: {value}" for attr, value in specs)
    spec_body = f"The {name} {intro}\n\nSpecifications:\n{lines}"
    days, warehouse = _plural(r.randrange(1, 10), "business day"), r.choice(_WAREHOUSES)
    order_body = (f"Order code {code} is the catalogue number of the {name}. Dealers order it under this code, "
                  f"and it ships from the {warehouse} warehouse within {days}.")
    if former:
        order_body += f" Until {year} it was sold as the {former}."
    fault, button = r.choice(_FAULTS)
    hold = f"{r.randrange(3, 16)} seconds"
    support_body = (f"If your {name} {fault}, hold the {button} for {hold} to reset it. If that does not help, "
                    f"contact {COMPANY} support with your order number.")
    facts = [Fact(attr, value, spec_id) for attr, value in specs]
    facts += [Fact("launch year", year, spec_id), Fact("shipping time", days, order_id),
              Fact("warehouse", warehouse, order_id), Fact(f"reset time when it {fault}", hold, support_id)]
    docs = [Doc(spec_id, name, spec_body, name, split), Doc(order_id, f"Order code {code}", order_body, name, split),
            Doc(support_id, f"{name}: it {fault}", support_body, name, split)]
    return Product(name, category, code, former, split, tuple(facts)), docs


# Policies: (name, text with {placeholders}, {attribute: (placeholder, value maker)}).
_POLICIES: list[tuple[str, str, dict[str, tuple[str, object]]]] = [
    ("Returns", "Unused items can be returned within {window} of delivery in their original packaging. "
     "Refunds reach the original payment method within {refund}.",
     {"return window": ("window", lambda r: f"{r.randrange(14, 61)} days"),
      "refund time": ("refund", lambda r: f"{r.randrange(3, 11)} business days")}),
    ("Free shipping", "Standard shipping is free on orders over {threshold}. Below that, standard shipping costs "
     "{fee}.", {"free shipping threshold": ("threshold", lambda r: f"€{r.randrange(5, 20) * 5}"),
                "standard shipping fee": ("fee", lambda r: f"€{r.randrange(3, 10)}.90")}),
    ("Express delivery", "Express delivery costs {fee} and arrives within {time} for orders placed before {cutoff}.",
     {"express delivery fee": ("fee", lambda r: f"€{r.randrange(9, 30)}"),
      "express delivery time": ("time", lambda r: _plural(r.randrange(1, 3), "business day")),
      "express order cutoff": ("cutoff", lambda r: f"{r.randrange(11, 17)}:00")}),
    ("Warranty claims", "Warranty claims are filed online with the receipt. Approved claims are repaired or "
     "replaced within {time}; the return postage is {postage}.",
     {"warranty claim processing time": ("time", lambda r: f"{r.randrange(7, 31)} days"),
      "warranty return postage": ("postage", lambda r: r.choice(["free", "paid by the customer", "€5"]))}),
    ("Loyalty programme", "Trail Club members earn {points} for every euro spent. {redeem} points can be redeemed "
     "for a €10 voucher.", {"loyalty points per euro": ("points", lambda r: _plural(r.randrange(1, 6), "point")),
                            "points for a voucher": ("redeem", lambda r: f"{r.randrange(2, 11) * 100}")}),
    ("Student discount", "Students with a valid student card get {discount} off full-price items, up to {cap} "
     "orders a year.", {"student discount": ("discount", lambda r: f"{r.randrange(5, 26)}%"),
                        "student discount order limit": ("cap", lambda r: f"{r.randrange(2, 13)}")}),
    ("Gift cards", "Gift cards are valid for {validity} from purchase and can be used online and in stores. "
     "The smallest gift card is {minimum}.",
     {"gift card validity": ("validity", lambda r: _plural(r.randrange(1, 6), "year")),
      "smallest gift card": ("minimum", lambda r: f"€{r.randrange(1, 11) * 10}")}),
    ("Repair service", "The repair workshop fixes zips, seams and poles. A typical repair takes {time} and costs "
     "from {price}.", {"repair time": ("time", lambda r: f"{r.randrange(5, 22)} days"),
                       "repair starting price": ("price", lambda r: f"€{r.randrange(10, 40)}")}),
    ("Rental", "Tents and kayaks can be rented from the {store} store for {price} per day, with a deposit of "
     "{deposit}.", {"rental store": ("store", lambda r: r.choice(_WAREHOUSES)),
                    "rental price per day": ("price", lambda r: f"€{r.randrange(8, 40)}"),
                    "rental deposit": ("deposit", lambda r: f"€{r.randrange(5, 30) * 10}")}),
    ("Price match", "If you find a lower price at an authorised dealer within {window} of purchase, the difference "
     "is refunded.", {"price match window": ("window", lambda r: f"{r.randrange(7, 31)} days")}),
    ("Trade-in", "Used gear in good condition can be traded in for store credit of up to {share} of its original "
     "price.", {"trade-in credit": ("share", lambda r: f"{r.randrange(10, 51)}%")}),
    ("Customer service hours", "Customer service answers the phone from {open} to {close} on weekdays; email "
     "replies arrive within {reply}.", {"phone opening time": ("open", lambda r: f"{r.randrange(7, 10)}:00"),
                                        "phone closing time": ("close", lambda r: f"{r.randrange(16, 21)}:00"),
                                        "email reply time": ("reply",
                                                             lambda r: _plural(r.randrange(1, 4), "business day"))}),
    ("International shipping", "Orders ship to {count} countries. International delivery takes {time} and "
     "customs fees are {customs}.",
     {"number of shipping countries": ("count", lambda r: f"{r.randrange(12, 41)}"),
      "international delivery time": ("time", lambda r: f"{r.randrange(4, 15)} business days"),
      "customs fees": ("customs", lambda r: r.choice(["paid by the customer", "included in the price"]))}),
    ("Click and collect", "Online orders can be collected in store after {time}. Uncollected orders are held for "
     "{hold}.", {"click and collect time": ("time", lambda r: f"{r.randrange(2, 25)} hours"),
                 "click and collect holding period": ("hold", lambda r: f"{r.randrange(5, 15)} days")}),
    ("Payment methods", "The web shop accepts cards and invoices. Invoices are due within {due}, and "
     "instalments are available from {minimum}.",
     {"invoice due time": ("due", lambda r: f"{r.randrange(10, 31)} days"),
      "instalment minimum": ("minimum", lambda r: f"€{r.randrange(10, 51) * 10}")}),
    ("Corporate orders", "Companies ordering more than {quantity} items get a volume discount of {discount}.",
     {"corporate order minimum": ("quantity", lambda r: f"{r.randrange(2, 11) * 10}"),
      "corporate volume discount": ("discount", lambda r: f"{r.randrange(5, 21)}%")}),
    ("Product recycling", "Worn-out gear can be dropped at any store for recycling, and each item earns a voucher "
     "of {voucher}.", {"recycling voucher": ("voucher", lambda r: f"€{r.randrange(2, 16)}")}),
    ("Newsletter", "Newsletter subscribers get {discount} off their first order and early access {days} before "
     "each sale.", {"newsletter discount": ("discount", lambda r: f"{r.randrange(5, 21)}%"),
                    "newsletter early access": ("days", lambda r: _plural(r.randrange(1, 8), "day"))}),
    ("Outdoor courses", "Weekend courses in paddling and winter camping cost {price} and take at most {size} "
     "participants.", {"course price": ("price", lambda r: f"€{r.randrange(8, 40) * 10}"),
                       "course group size": ("size", lambda r: f"{r.randrange(6, 17)} participants")}),
    ("Lost orders", "A parcel that has not arrived {days} after dispatch is traced by customer service, and a "
     "replacement is sent after {wait}.",
     {"lost parcel tracing delay": ("days", lambda r: f"{r.randrange(5, 15)} days"),
      "lost parcel replacement wait": ("wait", lambda r: f"{r.randrange(7, 22)} days")}),
]


def build_kb(seed: int = 0, products: int = 80, stems: Sequence[str] = tuple(_STEMS),
             ghost_stems: Sequence[str] = tuple(_GHOST_STEMS), policies: bool = True) -> KnowledgeBase:
    """The knowledge base for `seed`: `products` products (3 documents each) and, with `policies`, 20 policies.

    `stems` and `ghost_stems` limit product names and names of products that do not exist (synthetic
    training knowledge bases use the training split's stems only, and no policies).
    """
    if not 10 <= products <= len(stems):
        raise ValueError(f"products must be in [10, {len(stems)}], got {products}")
    r = random.Random(seed)
    categories = list(_CATEGORIES)
    pool = list(stems)
    stems = r.sample(pool, products)
    codes: set[str] = set()
    made: list[Product] = []
    docs: list[Doc] = []
    former_stems = [s for s in pool if s not in stems]  # former names never clash with current ones
    for i, stem in enumerate(stems):
        category = categories[i % len(categories)]
        name = f"{stem} {_CATEGORIES[category][0]}"
        former = None
        if former_stems and r.random() < 0.4:
            former = f"{former_stems.pop(r.randrange(len(former_stems)))} {_CATEGORIES[category][0]}"
        product, product_docs = _product_docs(r, name, category, "", codes, former)
        made.append(product)
        docs += product_docs
    # Splits are assigned per category, so each split has every kind of product.
    split_by_name: dict[str, str] = {}
    for category in categories:
        members = [p.name for p in made if p.category == category]
        for j, name in enumerate(members):
            split_by_name[name] = split_of(j, len(members))
    made = [Product(p.name, p.category, p.code, p.former_name, split_by_name[p.name], p.facts) for p in made]
    made_policies: list[Policy] = []
    order = r.sample(range(len(_POLICIES)), len(_POLICIES)) if policies else []
    for rank, i in enumerate(order):
        name, text, attributes = _POLICIES[i]
        values = {placeholder: make(r) for placeholder, make in attributes.values()}
        doc_id, split = f"policies/{slug(name)}", split_of(rank, len(_POLICIES))
        policy_facts = tuple(Fact(attr, values[placeholder], doc_id) for attr, (placeholder, _) in attributes.items())
        made_policies.append(Policy(name, split, policy_facts))
        docs.append(Doc(doc_id, f"{name} policy", f"{COMPANY}: {text.format(**values)}", name, split))
    docs = [Doc(d.doc_id, d.title, d.body, d.entity, split_by_name.get(d.entity, d.split)) for d in docs]
    named = set(stems) | {p.former_name.split()[0] for p in made if p.former_name}
    free = [s for s in ghost_stems if s not in named]
    ghosts = tuple(f"{stem} {_CATEGORIES[categories[i % len(categories)]][0]}" for i, stem in enumerate(free[:20]))
    return KnowledgeBase(tuple(docs), tuple(made), tuple(made_policies), ghosts, seed)
