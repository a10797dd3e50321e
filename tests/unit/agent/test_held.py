"""The answer beside the gate (`AgentConfig.answer_beside_gate`) on the scripted engine: what the user sees is the
sequential path's, an answer the gate did not release is aborted and never seen, and its tokens are counted."""

from __future__ import annotations

import asyncio

import pytest

from gatehead.agent import Agent, AgentConfig
from gatehead.agent.prompts import NOT_FOUND, REFUSAL
from gatehead.agent.state import as_passage
from gatehead.testing import ScriptedStore as Store

QUESTION = "How long is the Vale Lantern's warranty?"


async def turn(agent: Agent, question: str = QUESTION, thread: str = "thread"):
    """(tokens streamed, node names in order, the result) of one turn."""
    tokens, nodes, result = [], [], None
    async for event in agent.stream(question, thread, cache_salt="tenant"):
        if event.kind == "token":
            tokens.append(event.text)
        elif event.kind == "node":
            nodes.append(event.node)
        else:
            result = event.result
    return tokens, nodes, result


def test_an_answer_beside_the_gate_is_what_the_sequential_turn_shows(engine) -> None:
    seen = {}
    for beside in (False, True):
        e = engine("answer", gate_seconds=0.01)
        seen[beside] = asyncio.run(turn(Agent(e, Store(), AgentConfig(answer_beside_gate=beside))))
        assert e.streamed == [len(e.answer.split(" "))]  # one answer, made once
        assert all(kw["cache_salt"] == "tenant" for _, kw in e.calls)
        if beside:  # submitted before the gate returned, its tokens held until then
            assert [c for c, _ in e.calls] == ["gate", "stream"] or [c for c, _ in e.calls] == ["stream", "gate"]
            assert e.calls[[c for c, _ in e.calls].index("stream")][1]["max_tokens"] == AgentConfig.max_answer_tokens
    (tokens, nodes, result), (tokens_beside, nodes_beside, result_beside) = seen[False], seen[True]
    assert tokens_beside == tokens and "".join(tokens) == result.answer and nodes_beside == nodes
    assert (result_beside.decision, result_beside.answer, result_beside.gates) == \
        (result.decision, result.answer, result.gates)
    generate = [t for t in result_beside.timings if t["node"] == "generate"]
    assert [g["held"] for g in generate] == [True] and generate[0]["completion_tokens"] == len(result.answer.split(" "))


def test_a_refused_turn_aborts_its_held_answer_and_shows_none_of_it(engine) -> None:
    e = engine("refuse", gate_seconds=0.05)  # the whole answer is made while the gate runs
    agent = Agent(e, Store(), AgentConfig(answer_beside_gate=True))
    tokens, nodes, result = asyncio.run(turn(agent))
    assert e.streamed == [len(e.answer.split(" "))]
    assert (tokens, result.decision, result.answer) == ([], "refuse", REFUSAL)
    assert "generate" not in nodes and not result.generated
    assert result.gates[-1]["wasted_answer_tokens"] == len(e.answer.split(" "))
    # The held answer's prompt, its share read from the prefix cache and its tokens count in the turn's usage
    # (the scripted gate reads no cache; its answers report all but one prompt token read from it).
    prompt = e.prompts.build(QUESTION, [as_passage(Store.DOCUMENT)], ())
    assert result.usage["nodes"]["gate"] == {"prompt_tokens": len(prompt.gate) + len(prompt.answer),
                                             "cached_tokens": len(prompt.answer) - 1,
                                             "completion_tokens": len(e.answer.split(" "))}
    history = asyncio.run(agent.history("thread"))
    assert [t.text for t in history] == [QUESTION, REFUSAL]  # nothing of the held answer is stored


def test_an_answer_cut_off_by_the_gate_is_aborted_in_flight(engine) -> None:
    e = engine("refuse")
    aborted = endless_stream(e)  # the answer stays in flight: aborting it cancels the request
    tokens, _, result = asyncio.run(turn(Agent(e, Store(), AgentConfig(answer_beside_gate=True))))
    assert (tokens, result.decision, aborted) == ([], "refuse", [True])
    assert result.gates[-1]["wasted_answer_tokens"] == 0


def test_a_search_aborts_the_first_held_answer_and_releases_the_second(engine) -> None:
    e = engine("search", "answer", gate_seconds=0.05)
    tokens, nodes, result = asyncio.run(turn(Agent(e, Store(), AgentConfig(answer_beside_gate=True))))
    assert nodes == ["begin", "retrieve", "gate", "rewrite", "retrieve", "gate", "generate", "finish"]
    words = len(e.answer.split(" "))
    assert e.streamed == [words, words]  # two answers made, one per gate
    assert [g.get("wasted_answer_tokens") for g in result.gates] == [words, None]
    assert "".join(tokens) == result.answer == e.answer  # streamed once: the released one's tokens only


def test_searches_that_run_out_waste_every_held_answer(engine) -> None:
    e = engine("search", "search", gate_seconds=0.05)
    tokens, _, result = asyncio.run(turn(Agent(e, Store(), AgentConfig(answer_beside_gate=True, max_searches=1))))
    assert (tokens, result.decision, result.answer) == ([], "not_found", NOT_FOUND)
    assert [g["wasted_answer_tokens"] for g in result.gates] == [len(e.answer.split(" "))] * 2


def test_a_failed_gate_aborts_the_held_answer(engine) -> None:
    e = engine("answer")
    aborted = endless_stream(e)

    async def gate(*args, **kwargs):
        await asyncio.sleep(0.01)
        raise RuntimeError("the gate failed")

    e.gate = gate
    with pytest.raises(RuntimeError, match="the gate failed"):
        asyncio.run(turn(Agent(e, Store(), AgentConfig(answer_beside_gate=True))))
    assert aborted == [True]


def test_a_turn_cancelled_while_its_released_answer_streams_aborts_it(engine) -> None:
    e = engine("answer")
    aborted = endless_stream(e)

    async def run() -> None:
        task = asyncio.ensure_future(turn(Agent(e, Store(), AgentConfig(answer_beside_gate=True))))
        while not e.streamed:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # the gate has said answer and `generate` reads the held answer
        assert aborted == []
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []  # nothing left running

    asyncio.run(run())
    assert aborted == [True]


def endless_stream(e) -> list[bool]:
    """Make `e`'s generations stay in flight, never yielding; the list returned gets True for each one aborted."""
    aborted: list[bool] = []

    async def stream(prompt, **kwargs):
        e.calls.append(("stream", kwargs))
        e.streamed.append(0)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            aborted.append(True)
            raise
        yield  # an async generator

    e.stream = stream
    return aborted
