"""The checks of a generated answer: the refusal sentence, and whether the cited passages carry the answer."""

from __future__ import annotations

import pytest

from gatehead.agent.grounding import cited_passages, grounded, is_refusal, normalized
from gatehead.agent.prompts import REFUSAL
from gatehead.gate.prompt import Passage

VALE = Passage("The Vale Lantern joined the catalogue in 2019.\n\nSpecifications:\n- Price: €199\n- Weight: 550 g\n"
               "- Warranty: 2 years", title="Vale Lantern", source="products/vale-lantern.md")
NOTICE = Passage("Order code GW-960 is the catalogue number of the Vale Lantern. It ships within 6 business days.",
                 title="Order code GW-960", source="orders/gw-960.md")


def test_normalized_is_case_space_and_surrounding_punctuation_blind() -> None:
    assert normalized("  I’m sorry,\n but the documents do not cover that. ") == normalized(REFUSAL.upper())
    assert normalized("€199 [1] .") == "€199 [1]"


@pytest.mark.parametrize(("answer", "refusal"), [
    (REFUSAL, True), ("i'm sorry, but the documents do not cover that", True),
    (REFUSAL + " Try the support pages.", True), ("I could not find this in the documents.", True),
    ("I'm sorry, the Vale Lantern costs €199 [1].", False), ("€199 [1]", False),
])
def test_is_refusal(answer, refusal) -> None:
    assert is_refusal(answer) is refusal


@pytest.mark.parametrize(("answer", "passages", "expected"), [
    ("€199 [1]", [VALE], True),  # the whole answer is in the cited passage
    ("550 g [1].", [NOTICE, VALE], False),  # cites the notice, which has no weight
    ("550 g [2].", [NOTICE, VALE], True),
    ("The Vale Lantern weighs 550 g [1].", [VALE], True),  # every number and name is there
    ("It has a 2-year warranty [1].", [VALE], True),
    ("450 g [1]", [VALE], False),  # a value the passage does not hold
    ("It weighs 199 g [1]", [VALE], False),  # the passage's number with another unit (€199)
    ("The Vale Lantern weighs 550 grams and costs €199 [1].", [VALE], False),  # "550 grams" is not written there
    ("It costs €199 and weighs 550 g [1].", [VALE], True),  # "and" after a number is no unit
    ("It costs €19 [1]", [VALE], False),  # a number is a whole token: €19 is not €199
    ("The Valen Lantern costs €199 [1]", [VALE], False),  # a name the passage does not hold
    ("€199", [VALE], False),  # no citation
    ("€199 [3]", [NOTICE, VALE], False),  # a citation that points at no passage
    ("€199 [1]", [], False),
    ("It ships within 6 business days [1] and costs €199 [2].", [NOTICE, VALE], True),
])
def test_grounded(answer, passages, expected) -> None:
    assert grounded(answer, passages) is expected


def test_cited_passages_are_numbered_from_one_in_prompt_order() -> None:
    assert cited_passages("x [2] y [1] [2]", [NOTICE, VALE]) == [NOTICE, VALE]
    assert cited_passages("x [0]", [NOTICE]) is None and cited_passages("x", [NOTICE]) == []
