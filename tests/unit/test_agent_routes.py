"""Every route of the agent's graph on the scripted engine (tests/unit/conftest.py): no vLLM, seconds.

The scripted engine records every call, so a test checks what the graph asked of the engine as well
as what it returned.
"""

from __future__ import annotations

import asyncio

import pytest

from gatehead.agent import Agent, AgentConfig, Engine
from gatehead.agent.prompts import NOT_FOUND, REFUSAL
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
    assert generate["prompt_tokens"] > 0 and generate["answer_tokens"] == len(e.answer.split(" "))


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
    assert e.calls[-1] == ("stream", {"max_tokens": 7, "cache_salt": None})
    with pytest.raises(InvalidInput, match="the question is empty"):
        ask(Agent(engine(), Store()), "  ")
    with pytest.raises(InvalidInput, match="max_answer_tokens must be >= 1"):
        ask(Agent(engine(), Store()), "How long?", max_answer_tokens=0)


def test_an_engine_without_a_gate_adapter_is_refused(engine) -> None:
    e = engine()
    e.prompts = None
    with pytest.raises(ValueError, match="needs an engine started with a gate adapter"):
        Agent(e, Store())
