"""Engine health: a dead engine fails every caller at once and says so; a restart reproduces outputs."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from gatehead.evals.workload import synthetic_requests
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.tiny import TinyModel


async def fixed_run(engine: SharedEngine, prompts):
    # One arrival: the batched branch groups the gates of a step, so the grouping must not hang on timing.
    gates = await engine.together([engine.gate_prompt(p.gate) for p in prompts])
    answers = await engine.generate_many([p.answer for p in prompts], max_tokens=24, ignore_eos=True)
    return np.array([[g.result.probs[k] for k in ("answer", "refuse", "search")] for g in gates]), \
        [a.token_ids for a in answers]


def test_dead_engine_fails_waiting_callers_and_restart_reproduces(engines, loop, tiny: TinyModel) -> None:
    from vllm.v1.engine.exceptions import EngineDeadError

    first = engines()
    prompts = [first.prompts.build(r.question, r.passages, r.conversation) for r in synthetic_requests(8, 11)]
    before = loop.run(fixed_run(first, prompts))
    assert first.alive

    async def waiting_then_kill():
        calls = [asyncio.ensure_future(first.generate(p.answer, max_tokens=600, ignore_eos=True)) for p in prompts]
        await asyncio.sleep(1.0)  # the requests are running
        for pid in first.engine_pids():
            os.kill(pid, signal.SIGKILL)
        return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), timeout=60)

    outcomes = loop.run(waiting_then_kill())
    assert all(isinstance(o, EngineDeadError) for o in outcomes), outcomes
    assert not first.alive
    with pytest.raises(EngineDeadError):
        loop.run(first.gate_prompt(prompts[0].gate))

    again = engines()
    after = loop.run(fixed_run(again, prompts))
    assert np.array_equal(before[0], after[0]) and before[1] == after[1]


@pytest.mark.parametrize("extra,name", [
    ({"pipeline_parallel_size": 2}, "pipeline parallelism"),
    ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative decoding"),
    ({"enable_lora": True}, "vLLM LoRA adapters"),
    ({"quantization": "fp8"}, "quantised base weights"),
])
def test_unsupported_engine_arguments_are_refused_before_starting(tiny: TinyModel, extra, name) -> None:
    with pytest.raises(ValueError, match=f"does not support {name}"):
        SharedEngine(EngineConfig(model=tiny.model_dir, adapter=tiny.adapter_dir, extra=extra))
