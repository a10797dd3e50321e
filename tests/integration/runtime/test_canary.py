"""Canaries on the demo engine: they match while it is well and catch a corrupted branch weight or KV cache."""

from __future__ import annotations

import logging

import pytest

from gatehead.runtime.canary import Canaries, CanaryConfig, GateRecord, GenerationRecord


def test_canaries_catch_a_corrupted_branch_weight_and_kv_cache(demo_shared, loop, caplog) -> None:
    canaries = Canaries(demo_shared, CanaryConfig(interval=0))
    loop.run(canaries.record())
    gates = [r for r in canaries.records.values() if isinstance(r, GateRecord)]
    generations = [r for r in canaries.records.values() if isinstance(r, GenerationRecord)]
    assert len(gates) == 3 and len(generations) == 2, canaries.records
    assert all(len(r.token_ids) >= 2 for r in generations)  # the demo model answers with clear leads
    for _ in range(2):
        assert loop.run(canaries.check()) == []
    assert canaries.healthy and canaries.state.checks == 2

    try:
        loop.run(demo_shared.inject_fault("branch", -1.0))  # the gate head's sign flipped
        with caplog.at_level(logging.ERROR, logger="gatehead.canary"):
            for n in range(1, 4):
                mismatches = loop.run(canaries.check())
                assert {m.canary for m in mismatches} == {"gate-answerable", "gate-unrelated", "gate-empty"}
                assert canaries.healthy == (n < 3) and canaries.state.consecutive == n
        assert "canary mismatch (3 in a row): gate-answerable: gate probabilities" in caplog.text
        assert "max |dp|" in caplog.text
    finally:
        loop.run(demo_shared.inject_fault("restore"))
    assert loop.run(canaries.check()) == [] and canaries.healthy and canaries.state.consecutive == 0

    # Every cached block's keys and values negated, then zeroed (a block read before it was written).
    for scale in (-1.0, 0.0):
        assert loop.run(canaries.check()) == []  # the canaries' prompts are cached again
        try:
            loop.run(demo_shared.inject_fault("kv", scale))
            mismatches = loop.run(canaries.check())
            assert {m.canary for m in mismatches} == {"generation-kettle", "generation-ferry"}, scale
            assert all("greedy tokens differ" in m.diff or "logprobs" in m.diff for m in mismatches)
        finally:
            assert loop.run(demo_shared.reset_prefix_cache())  # the corrupted blocks are dropped
    assert loop.run(canaries.check()) == []
    assert canaries.state.failed_checks == 5 and canaries.state.checks == 11


def test_canary_config_refuses_bad_values() -> None:
    for bad in ({"interval": -1}, {"gate_tolerance": 0}, {"repeats": 1}, {"unready_after": 0},
                {"min_margin": 0}, {"max_tokens": 0}):
        with pytest.raises(ValueError, match="CanaryConfig"):
            CanaryConfig(**bad)
