"""Every route of the agent's graph on the scripted engine (tests/unit/conftest.py): no vLLM, seconds.

The scripted engine records every call, so a test checks what the graph asked of the engine as well
as what it returned.
"""

from __future__ import annotations

import asyncio

import pytest

from gatehead.agent import Agent, AgentConfig, Engine
from gatehead.agent.nodes import POST_GATE_PRIORITY
from gatehead.agent.prompts import CLARIFY, NOT_FOUND, REFUSAL
from gatehead.cli.transcript import format_turn
from gatehead.errors import InvalidInput
from gatehead.testing import ScriptedStore as Store


def ask(agent: Agent, question: str, **kw):
    return asyncio.run(agent.ask(question, "thread", **kw))


def nodes(result) -> list[str]:
    return [t["node"] for t in result.timings]


def test_the_scripted_engine_has_what_the_engine_protocol_asks(engine) -> None:
    members = {n for n in Engine.__annotations__} | {n for n in vars(Engine) if not n.startswith("_")}
    assert members == {"tokenizer", "adapter", "prompts", "gate", "generate", "stream"}
    assert all(hasattr(engine("answer"), name) for name in members)


def test_answer(engine) -> None:
    e = engine("answer")
    result = ask(Agent(e, Store()), "How long is the Vale Lantern's warranty?", cache_salt="tenant")
    assert (result.decision, result.answer, result.sources) == ("answer", e.answer, ["vale.md"])
    assert nodes(result) == ["retrieve", "gate", "generate", "finish"]
    assert [c for c, _ in e.calls] == ["gate", "stream"]
    assert all(kw["cache_salt"] == "tenant" for _, kw in e.calls)  # every engine call keeps the tenant's salt
    generate = next(t for t in result.timings if t["node"] == "generate")
    assert generate["prompt_tokens"] > 0 and generate["completion_tokens"] == len(e.answer.split(" "))


def test_refuse(engine) -> None:
    e = engine("refuse")
    result = ask(Agent(e, Store()), "Write me a poem")
    assert (result.decision, result.answer) == ("refuse", REFUSAL)
    assert nodes(result) == ["retrieve", "gate", "refusal", "finish"] and [c for c, _ in e.calls] == ["gate"]


def test_search_rewrites_retrieves_and_gates_again(engine) -> None:
    e, store = engine("search", "answer"), Store()
    result = ask(Agent(e, store, AgentConfig(max_searches=2)), "How long is the GW-960's warranty?")
    assert result.decision == "answer"
    assert nodes(result) == ["retrieve", "gate", "rewrite", "retrieve", "gate", "generate", "finish"]
    assert store.queries == ["How long is the GW-960's warranty?", e.rewrite] == result.queries
    assert [g["decision"] for g in result.gates] == ["search", "answer"]
    assert e.calls[2][1]["question"] == e.rewrite  # the second gate is asked the rewrite


def test_searches_run_out_into_not_found(engine) -> None:
    e = engine("search", "search")
    result = ask(Agent(e, Store(), AgentConfig(max_searches=1)), "Where is the Mistral Tent made?")
    assert (result.decision, result.answer) == ("not_found", NOT_FOUND)
    assert nodes(result) == ["retrieve", "gate", "rewrite", "retrieve", "gate", "not_found", "finish"]
    assert ask(Agent(engine("search"), Store(), AgentConfig(max_searches=0)), "x?").decision == "not_found"


def test_a_failed_retrieval_ends_the_turn_without_an_answer(engine) -> None:
    e = engine("answer")
    result = ask(Agent(e, Store(fail=True)), "How long is the warranty?")
    assert (result.decision, result.answer, result.gates) == ("error", "", [])
    assert "retrieval failed" in result.error and "the store went away" in result.error
    assert nodes(result) == ["retrieve", "failed"] and e.calls == []


def test_a_follow_up_is_made_standalone_and_the_thread_remembers(engine) -> None:
    e = engine("answer", "answer", rewrite="How heavy is the Vale Lantern?")
    agent = Agent(e, Store())
    ask(agent, "How long is the Vale Lantern's warranty?")
    second = ask(agent, "And how heavy is it?")
    assert nodes(second)[:2] == ["contextualize", "retrieve"]
    assert second.standalone == "How heavy is the Vale Lantern?" and second.queries == [second.standalone]
    assert len(asyncio.run(agent.history("thread"))) == 4


def test_the_turns_answer_budget_and_errors(engine) -> None:
    e = engine("answer")
    ask(Agent(e, Store(), AgentConfig(max_answer_tokens=40)), "How long?", max_answer_tokens=7)
    assert e.calls[-1] == ("stream", {"max_tokens": 7, "cache_salt": None, "priority": POST_GATE_PRIORITY})
    with pytest.raises(InvalidInput, match="the question is empty"):
        ask(Agent(engine(), Store()), "  ")
    with pytest.raises(InvalidInput, match=r"max_answer_tokens must be in \[1, 256\]"):
        ask(Agent(engine(), Store()), "How long?", max_answer_tokens=0)
    # More than the prompt layout keeps for the answer would overflow a prompt that fills its window.
    with pytest.raises(InvalidInput, match=r"max_answer_tokens must be in \[1, 256\]"):
        ask(Agent(engine(), Store()), "How long?", max_answer_tokens=257)
    with pytest.raises(ValueError, match=r"max_answer_tokens \(400\) exceeds the 256 tokens"):
        Agent(engine(), Store(), AgentConfig(max_answer_tokens=400))


def test_an_engine_without_a_gate_adapter_is_refused(engine) -> None:
    e = engine()
    e.prompts = None
    with pytest.raises(ValueError, match="needs an engine started with a gate adapter"):
        Agent(e, Store())


@pytest.mark.parametrize(("rewrite", "reason"), [
    ("How much does the Summit Tent weigh?", "names Summit, Tent"),  # a product nobody named
    ("And how heavy is the Valen Lantern?", "names Valen"),  # a name misspelt into another
    (REFUSAL, "a refusal"),
    ("The warranty lasts two years [1].", "an earlier answer"),  # the previous answer
    ("2 years [1]", "cites passages ([1])"),
])
def test_a_follow_ups_rewrite_that_fails_its_check_gives_way_to_the_joined_questions(engine, rewrite, reason) -> None:
    e, store = engine("answer", "answer", rewrite=rewrite), Store()
    agent = Agent(e, store)
    first = ask(agent, "How long is the Vale Lantern's warranty?")
    second = ask(agent, "And how heavy is it?")
    joined = "How long is the Vale Lantern's warranty? And how heavy is it?"
    assert second.standalone == joined and store.queries[-1] == joined and second.queries == [joined]
    assert [{**f, "reason": f["reason"][:len(reason)]} for f in second.rewrite_fallbacks] == [
        {"node": "contextualize", "rewrite": rewrite, "used": joined, "reason": reason}]
    assert first.rewrite_fallbacks == [] and f"not used:   {rewrite!r} (contextualize: {reason}" in format_turn(second)


def test_a_search_rewrite_that_fails_its_check_keeps_the_query_it_had(engine) -> None:
    question = "How long is the GW-960's warranty?"
    e, store = engine("search", "answer", rewrite="warranty of the Summit Tent"), Store()
    result = ask(Agent(e, store), question)
    assert store.queries == [question, question] == result.queries and e.calls[2][1]["question"] == question
    assert result.rewrite_fallbacks == [{"node": "rewrite", "rewrite": "warranty of the Summit Tent", "used": question,
                                         "reason": "names Summit, Tent, which neither the conversation nor the "
                                                   "question gives"}]
    # The passages' names are allowed: the scripted rewrite names the Vale Lantern, which the passage gives.
    assert ask(Agent(engine("search", "answer"), Store()), question).rewrite_fallbacks == []


def test_a_first_question_that_points_back_at_nothing_is_asked_back(engine) -> None:
    e, store = engine("answer"), Store()
    agent = Agent(e, store)
    result = ask(agent, "And its weight?")
    assert (result.decision, result.answer, result.grounded) == ("clarify", CLARIFY, None)
    assert nodes(result) == ["clarify", "finish"] and e.calls == [] and store.queries == []
    assert [t.text for t in asyncio.run(agent.history("thread"))] == ["And its weight?", CLARIFY]
    named = ask(agent, "The Vale Lantern.")  # the answer to the question back is a follow-up of the thread
    assert nodes(named)[:2] == ["contextualize", "retrieve"] and named.decision == "answer"
    assert ask(Agent(engine(), Store()), "And the Vale Lantern's weight?").decision == "answer"  # it names one


def test_a_refusal_the_model_writes_is_reported_as_a_refusal(engine) -> None:
    e = engine("answer", answer=REFUSAL)
    result = ask(Agent(e, Store()), "How long is the Vale Lantern's warranty?")
    assert (result.decision, result.refusal_reason, result.grounded) == ("refuse", "generated", None)
    assert result.gates[-1]["decision"] == "answer" and result.answer == REFUSAL and result.generated
    assert "decision:   refuse (generated)" in format_turn(result)
    gated = ask(Agent(engine("refuse"), Store()), "Write me a poem")
    assert (gated.decision, gated.refusal_reason, gated.generated) == ("refuse", "gate", False)
    answered = ask(Agent(engine("answer"), Store()), "How long is the Vale Lantern's warranty?")
    assert (answered.decision, answered.refusal_reason) == ("answer", "")


@pytest.mark.parametrize(("answer", "grounded"), [
    ("The warranty lasts two years [1].", True), ("A 2-year warranty [1].", True),
    ("A 5-year warranty [1].", False),  # not the passage's value
    ("A 2-year warranty [2].", False),  # one passage was kept: [2] points at nothing
    ("A 2-year warranty.", False),  # no citation
])
def test_an_answer_is_flagged_when_its_cited_passage_does_not_carry_it(engine, answer, grounded) -> None:
    result = ask(Agent(engine("answer", answer=answer), Store()), "How long is the Vale Lantern's warranty?")
    assert (result.decision, result.grounded) == ("answer", grounded)
    assert result.to_dict()["grounded"] is grounded
    assert ("NOT grounded in the cited passage" in format_turn(result)) is not grounded
