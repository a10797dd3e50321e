"""Follow-up training data: every kind of follow-up, rewrites that add no name, nothing held out."""

from __future__ import annotations

import random
import re
from collections import Counter

from gatehead.agent.prompts import ANSWER_SYSTEM, REFUSAL, REWRITE_SYSTEM
from gatehead.demo.finetune import _train_view
from gatehead.demo.kb import build_kb
from gatehead.demo.tasks import conversation_examples

NAME = re.compile(r"\b(?:[A-Z][a-z]+|[A-Z]{2}-\d{3})\b")


def names(text: str) -> set[str]:
    """Capitalised words and order codes, less the first word (a sentence may begin with any word)."""
    words = NAME.findall(text)
    first = text.split()[0] if text.split() else ""
    return {w.lower() for w in words if w != first}


def test_rewrites_keep_the_subject_and_add_no_name() -> None:
    view = _train_view(build_kb(0))
    made = conversation_examples(view, random.Random(3), 600)
    rewrites = [e for e in made if e.system == REWRITE_SYSTEM]
    assert len(rewrites) == 600
    for e in rewrites:
        seen = " ".join([e.question, *(t.text for t in e.conversation)]).lower()
        added = {n for n in names(e.target) if n not in seen and n not in ("what",)}
        assert not added, (e.question, [t.text for t in e.conversation], e.target)
    kinds = Counter()
    for e in rewrites:
        earlier = e.conversation[-1].text
        kinds["after a refusal"] += earlier == REFUSAL
        kinds["unchanged"] += e.target == e.question
        kinds["order code"] += bool(re.search(r"[A-Z]{2}-\d{3}", e.question))
    assert all(count >= 30 for count in kinds.values()), kinds
    answers = [e for e in made if e.system == ANSWER_SYSTEM]
    assert sum(e.target == REFUSAL for e in answers) >= 60 and sum(e.target != REFUSAL for e in answers) >= 200


def test_the_training_view_holds_no_held_out_product_or_ghost() -> None:
    kb = build_kb(0)
    view = _train_view(kb)
    held_out = {p.name for p in kb.products if p.split != "train"} | set(kb.ghosts)
    made = conversation_examples(view, random.Random(4), 800)
    text = " ".join(" ".join([e.question, e.target, *(t.text for t in e.conversation), *(p.text for p in e.passages)])
                    for e in made)
    assert {d.split for d in view.docs} == {"train"}
    leaked = {name for name in held_out if name.lower() in text.lower()}
    assert not leaked, sorted(leaked)[:5]
