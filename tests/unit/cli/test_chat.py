"""`gatehead chat`'s printing of a turn's events, on the scripted engine: each text once, and what the turn's
checks said."""

from __future__ import annotations

import asyncio

from gatehead.agent import Agent
from gatehead.agent.prompts import CLARIFY, REFUSAL
from gatehead.cli.agent import _print_chat_event
from gatehead.testing import ScriptedStore


def chat(agent: Agent, *questions: str) -> None:
    async def go():
        for question in questions:
            async for event in agent.stream(question, "thread"):
                _print_chat_event(event)
    asyncio.run(go())


def test_each_turn_is_printed_once_with_its_checks(engine, capsys) -> None:
    chat(Agent(engine("answer", answer=REFUSAL), ScriptedStore()), "How long is the Vale Lantern's warranty?")
    refused = capsys.readouterr().out
    assert refused.count(REFUSAL) == 1 and "[refused by the model]" in refused  # streamed, not said again

    chat(Agent(engine(), ScriptedStore()), "And its weight?")
    assert capsys.readouterr().out == f"gatehead> {CLARIFY}\n"

    chat(Agent(engine(answer="A 5-year warranty [1].", rewrite="How heavy is the Summit Tent?"), ScriptedStore()),
         "How long is the Vale Lantern's warranty?", "And its weight?")
    out = capsys.readouterr().out
    assert "[sources: vale.md; not grounded in the cited passage]" in out
    # The rewrite names a product nobody named: the joined questions stand in, and the chat says so.
    assert "[rewrite 'How heavy is the Summit Tent?' not used: names Summit, Tent" in out
    assert "[standalone: How long is the Vale Lantern's warranty? And its weight?]" in out
