"""The threads eval's judgement: what counts as the right turn, and as a name a rewrite added."""

from __future__ import annotations

from gatehead.evals.threads import added_names, right, score


def test_a_rewrite_adds_a_name_the_thread_never_had() -> None:
    seen = "how much is the rowan lantern €354 [1] and the pine tent?"
    assert added_names("What is the capacity of the Summit Tent?", seen) == ["Summit"]
    assert added_names("What is the price of the Pine Tent?", seen) == []  # case aside
    assert added_names("what about the Valen Lantern?", "what about the Vale Lantern?") == ["Valen"]
    assert added_names("What is the price of BG-165?", "and bg-165?") == []
    assert added_names("What is the price of BG-166?", "and bg-165?") == ["BG-166"]
    assert added_names("Rowan Lantern weight?", "how heavy is the rowan lantern") == []
    assert added_names("What's the flinkingust?", "which button on it") == []  # a sentence's first word


def test_the_right_turn_is_what_the_line_expects() -> None:
    assert right("answer", "€354", "answer", "The Rowan Lantern costs €354 [1].")
    assert not right("answer", "€354", "answer", "€35 [1]")
    assert not right("answer", "€354", "refuse", "€354")
    assert right("refuse", "", "not_found", "I could not find this in the documents.")
    assert right("clarify", "", "clarify", "Which product do you mean?")
    assert not right("clarify", "", "answer", "450 g [1]")


def test_scores_count_the_turns_they_are_given() -> None:
    rows = [{"thread": "a", "turn": 1, "expect": "answer", "case": "first", "right": True, "decision": "answer",
             "names_added_by_model": [], "names_added_used": [], "grounded": True, "error": ""},
            {"thread": "a", "turn": 2, "expect": "answer", "case": "pronoun", "right": False, "decision": "answer",
             "names_added_by_model": ["Summit"], "names_added_used": [], "grounded": False, "error": ""},
            {"thread": "b", "turn": 1, "expect": "clarify", "case": "no-referent", "right": True,
             "decision": "clarify", "names_added_by_model": [], "names_added_used": [], "grounded": None, "error": ""}]
    figures = score(rows)
    assert figures["right_value_on_answerable"] == {"turns": 2, "right": 1, "rate": 0.5}
    assert figures["follow_ups_on_answerable"] == {"turns": 1, "right": 0, "rate": 0.0}
    assert figures["asked_back_where_expected"]["rate"] == 1.0 and figures["refused_where_expected"]["rate"] is None
    assert figures["rewrites_adding_a_name"] == {"model": 1, "used": 0}
    assert figures["answers_flagged_ungrounded"] == 1 and figures["threads"] == 2
    assert figures["missed_answerable_by_cause"] == {"answered with another value": 1}  # over every turn


def test_the_misses_are_told_apart_by_what_became_of_them() -> None:
    from gatehead.evals.threads import miss_causes

    def miss(expect: str, decision: str, reason: str = "") -> dict:
        return {"expect": expect, "decision": decision, "refusal_reason": reason}

    misses = [miss("answer", "answer"), miss("answer", "answer"), miss("answer", "refuse", "gate"),
              miss("answer", "refuse", "generated"), miss("answer", "clarify"), miss("answer", "refuse", "not found"),
              miss("refuse", "answer"), miss("clarify", "refuse", "gate")]  # expected no answer: not counted
    assert miss_causes(misses) == {"answered with another value": 2, "refused by the gate": 1,
                                   "refused by the generator": 1, "asked back": 1, "other": 1}
    assert miss_causes([]) == {}
