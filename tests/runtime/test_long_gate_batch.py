"""Known bug, found by the server tests (stop 16): concurrent long gate prompts come back without probabilities.

Eight gate requests of about 1,600 tokens each, submitted together to the demo engine (2k context),
return NaN probabilities (`GateError`: "the request's rows were incomplete") where one alone works.
It looks like gate prompts split over scheduler steps by chunked prefill while other gate prompts
share the step. Strict xfail: when it is fixed this test fails, and the mark must go.
"""

from __future__ import annotations

import asyncio

import pytest

from gatehead.runtime.engine import GateError


@pytest.mark.xfail(strict=True, raises=GateError, reason="concurrent long gate prompts lose their gate rows")
def test_concurrent_long_gate_prompts_all_get_probabilities(demo_shared, loop) -> None:
    questions = [f"{i} " + "lantern tent stove " * 500 for i in range(8)]
    alone = loop.run(demo_shared.gate(questions[0]))
    assert len(alone.prompt.gate) > 1500

    async def together():
        return await asyncio.gather(*(demo_shared.gate(q) for q in questions))

    outcomes = loop.run(together())
    assert all(abs(sum(o.result.probs.values()) - 1) < 1e-3 for o in outcomes)
