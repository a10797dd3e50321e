"""People's phrasings: families held out whole, out-of-scope messages held out, the hand-written set checked."""

from __future__ import annotations

import random

import pytest

from gatehead.demo import phrasings
from gatehead.demo.evaluate import evaluation_sets
from gatehead.demo.kb import build_kb, invented_stems
from gatehead.demo.questions import _ASK, _GENERIC, _POLICY_ASK, _UNKNOWN, handwritten_questions, phrased_questions
from gatehead.demo.splits import DATA_DIR, HANDWRITTEN, handwritten_texts, training_records
from gatehead.demo.splits import read_jsonl as read
from gatehead.demo.tasks import training_examples


def test_every_attribute_has_twelve_families_and_two_of_each_group_are_held_out_per_split() -> None:
    counts = phrasings.check()
    assert all(counts[key] >= 12 for key in (*phrasings.ASK_KEYS, phrasings.GENERIC, "unknown", "policy"))
    for group in (*phrasings.FAMILIES.values(), phrasings.UNKNOWN_FAMILIES, phrasings.POLICY_FAMILIES):
        held = {split: phrasings.families_in(group, split) for split in ("val", "test")}
        assert len(held["val"]) == len(held["test"]) == phrasings.HELD_OUT_FAMILIES
        assert not set(held["val"]) & set(held["test"])
        assert len(phrasings.families_in(group, "train")) == len(group) - 2 * phrasings.HELD_OUT_FAMILIES
    with pytest.raises(KeyError, match="no phrasing family 'price.nonsense'"):
        phrasings.family_split("price.nonsense")


def test_renders_follow_the_family_conventions() -> None:
    assert phrasings.render("price.lower", "how much is the {ref}", "price", "Rowan Lantern") == \
        "how much is the rowan lantern"
    typo = phrasings.render(phrasings.GENERIC_ATTR_TYPO, "What is the {attr} of the {ref}?", "battery life", "X")
    assert typo != "What is the battery life of the X?" and len(typo) == len("What is the battery life of the X?") - 1
    assert phrasings.render("reset.polite", "My {ref} {fault}.", "reset time when it will not switch on", "Y") == \
        "My Y will not switch on."


def test_held_out_families_and_messages_never_reach_training() -> None:
    kb = build_kb(0)
    asked = phrased_questions(kb, 0, drawn=10)
    by_split = {s: {q.family for q in asked if q.split == s and not q.family.startswith(("out-of-scope.",
                                                                                           "policy.natural"))}
                for s in ("train", "val", "test")}
    assert {phrasings.family_split(f) for f in by_split["train"]} == {"train"}
    assert {phrasings.family_split(f) for f in by_split["test"]} == {"test"}
    assert len(by_split["test"]) >= 20
    messages = {s: {q.question for q in asked if q.split == s and q.family.startswith("out-of-scope.")}
                for s in ("train", "val", "test")}
    assert not messages["train"] & (messages["val"] | messages["test"]) and len(messages["test"]) >= 40
    assert {q.label for q in asked if q.family.startswith("out-of-scope.")} == {"refuse"}
    # A synthetic knowledge base that trains is asked in training families only, its messages drawn afresh.
    stems = invented_stems(random.Random(0), 80, wide=True)
    synthetic = build_kb(seed=1000, products=40, stems=stems[:60], ghost_stems=stems[60:], policies=False)
    trains = phrased_questions(synthetic, 5, family_split="train", per_fact=1, drawn=4)
    assert {phrasings.family_split(q.family) for q in trains if not q.family.startswith("out-of-scope.")} == {"train"}
    examples = training_examples([], 2, seed=0, phrasings=True)
    assert not {e.question for e in examples} & (messages["val"] | messages["test"])
    # No template is shared by families of two splits (the same words would train a held-out family).
    splits_of: dict[str, set[str]] = {}
    for group in (*phrasings.FAMILIES.values(), phrasings.UNKNOWN_FAMILIES, phrasings.POLICY_FAMILIES):
        for fid, templates in group.items():
            for template in templates:
                splits_of.setdefault(template.lower(), set()).add(phrasings.family_split(fid))
    assert not {t: s for t, s in splits_of.items() if len(s) > 1}
    templates = {t.lower() for ts in _ASK.values() for t in ts} | {t.lower() for t in _GENERIC + _UNKNOWN + _POLICY_ASK}
    assert not {t for t, s in splits_of.items() if t in templates and s != {"train"}}, "a held-out family was trained"


def test_the_labelled_phrased_splits_keep_families_and_entities_apart() -> None:
    rows = {split: read(DATA_DIR / f"phrased-{split}.jsonl") for split in ("train", "val", "test")}
    for split, split_rows in rows.items():
        families = {r["family"] for r in split_rows if not r["family"].startswith(("out-of-scope.", "policy.natural"))}
        assert {phrasings.family_split(f) for f in families} == {split}, split
    trained = {r["entity"] for r in training_records(DATA_DIR, phrasings=True) if r["entity"]}
    held = {r["entity"] for split in ("val", "test") for r in rows[split] if r["entity"]}
    assert not trained & held
    sets = evaluation_sets(DATA_DIR, "val")  # test's, the same sets and "handwritten", are read only to measure
    assert set(sets) == {"template", "phrased", "out_of_scope"}
    assert len(sets["phrased"]) >= 200 and len(sets["out_of_scope"]) >= 40
    assert {r["label"] for r in sets["phrased"]} == {"answer", "search", "refuse"}
    assert len(read(DATA_DIR / "handwritten-test.jsonl")) >= 150  # the data checked, no model measured
    with pytest.raises(ValueError, match="split must be 'val' or 'test'"):
        evaluation_sets(DATA_DIR, "train")


def test_the_hand_written_set_is_never_trained_on() -> None:
    typed = handwritten_texts()
    listed = {m for _, m in phrasings.out_of_scope("train")}
    assert typed & listed, "no typed message equals a listed one: the filter below is untested"
    for split in ("train", "val"):
        assert not typed & {r["question"] for r in training_records(DATA_DIR, phrasings=True, split=split)}
    examples = training_examples([], 1, seed=0, phrasings=True, exclude=typed)
    assert not typed & {e.question for e in examples}


def test_the_hand_written_set_is_checked_against_the_documents() -> None:
    kb = build_kb(0)
    rows = read(HANDWRITTEN)
    questions = handwritten_questions(kb, rows)
    assert len(questions) >= 150 and {q.split for q in questions} == {"test"}
    test_entities = {p.name for p in kb.products if p.split == "test"} | {p.name for p in kb.policies
                                                                          if p.split == "test"}
    assert {q.entity for q in questions if q.label != "refuse"} <= test_entities
    assert all(kb.by_id[q.gold].body.count(q.answer) for q in questions if q.answer)
    good = next(r for r in rows if r["label"] == "answer")
    for bad, message in (({**good, "answer": "€1"}, "the documents say"),
                         ({**good, "attribute": "flavour"}, "has no fact 'flavour'"),
                         ({**good, "label": "maybe"}, "label 'maybe'")):
        with pytest.raises(ValueError, match=message):
            handwritten_questions(kb, [good, bad])
