"""The standalone-rewrite check and the first-turn reference check, on the rewrites weak models wrote."""

from __future__ import annotations

import pytest

from gatehead.agent.prompts import NOT_FOUND, REFUSAL
from gatehead.agent.rewrites import joined_question, names, refers_back, rewrite_problem


def thread(*texts: str) -> list[dict]:
    return [{"role": ("user", "assistant")[i % 2], "text": t} for i, t in enumerate(texts)]


PINE = thread("What is the capacity of the Summit Tent?", "4 people [1]")
VALE = thread("How long does the Vale Lantern's battery last?", "8 hours [1]")
RESET = thread("How do I reset the Alpine Lantern?", "5 seconds [1]")


def test_names_are_order_codes_and_capitalised_words_past_a_sentences_start() -> None:
    assert names("What is the capacity of the Summit Tent?") == ["Summit", "Tent"]
    assert names("What is the price of the BG-165? Is it light? I'm asking.") == ["BG-165"]
    assert names("How heavy is the Vale Lantern's case") == ["Vale", "Lantern"]
    assert names("and its weight?") == [] and names("Pine Tent") == ["Tent"]  # a sentence's first word is not one


@pytest.mark.parametrize(("rewrite", "question", "turns", "reason"), [
    ("What is the capacity of the Summit Tent?", "and the Pine Tent?", PINE, "drops Pine"),  # another product
    ("what about the Valen Lantern?", "what about the Vale Lantern?", VALE, "names Valen"),  # an invented one
    ("What does the Summit Tent weigh?", "And its weight?", VALE, "names Summit, Tent"),
    ("How much is the GW-960?", "And its price?", VALE, "names GW-960"),
    (REFUSAL, "And its weight?", VALE, "a refusal"),
    (NOT_FOUND.upper(), "And its weight?", VALE, "a refusal"),
    ("5 seconds [1]", "and for the Vale Lantern?", RESET, "an earlier answer"),
    ("8 hours", "and its weight?", thread("How long does the Vale Lantern's battery last?", "8 hours."),
     "an earlier answer"),
    ("It lasts 8 hours [1].", "and its weight?", VALE, "cites passages ([1])"),
    ("  ", "and its weight?", VALE, "empty"),
])
def test_bad_rewrites_say_why(rewrite, question, turns, reason) -> None:
    assert rewrite_problem(rewrite, question, turns).startswith(reason)


@pytest.mark.parametrize(("rewrite", "question", "turns"), [
    ("What is the capacity of the Pine Tent?", "and the Pine Tent?", PINE),
    ("What does the Vale Lantern weigh?", "And its weight?", VALE),
    ("what about the Vale Lantern's warranty?", "what about the warranty?", VALE),
    ("How do I reset the Alpine Lantern?", "How?", RESET),  # repeating the thread's question is no answer
])
def test_good_rewrites_pass(rewrite, question, turns) -> None:
    assert rewrite_problem(rewrite, question, turns) is None


def test_a_search_rewrite_may_use_the_passages_names_and_drop_the_questions_code() -> None:
    notice = "Order code GW-960 is the catalogue number of the Vale Lantern."
    rewrite = "What is the price of the Vale Lantern?"
    assert rewrite_problem(rewrite, "What is the price of the GW-960?", [], keep_names=False).startswith("names Vale")
    assert rewrite_problem(rewrite, "What is the price of the GW-960?", [], sources=[notice], keep_names=False) is None
    assert rewrite_problem("What is the price of the Valen Lantern?", "What is the price of the GW-960?", [],
                           sources=[notice], keep_names=False).startswith("names Valen")


def test_the_fallback_joins_the_threads_last_question_and_the_new_one() -> None:
    turns = thread("How much is the Rowan Lantern?", "€54 [1]")
    assert joined_question("and its weight?", turns) == "How much is the Rowan Lantern? and its weight?"
    assert joined_question(" And its weight? ", []) == "And its weight?"


@pytest.mark.parametrize("question", ["And its weight?", "What does it weigh?", "How much does that cost?",
                                      "what about the warranty?", "Are they waterproof?", "Is that the same one?"])
def test_a_question_that_points_back_at_nothing(question) -> None:
    assert refers_back(question)


@pytest.mark.parametrize("question", ["And the Vale Lantern's weight?", "What does the BG-165 weigh?",
                                      "Is there a tent that sleeps four?", "How much does the Mistral Tent cost?",
                                      "my rowan lantern will not switch on, how do I reset it",
                                      "How much is it to rent a kayak for a day?", "Who painted the Mona Lisa?"])
def test_a_question_that_names_or_brings_its_own_object(question) -> None:
    assert not refers_back(question)
