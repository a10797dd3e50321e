"""Suffix-mode (activated) gates in the shared engine, on a tiny model: the branch reads the prefix's
K/V from the paged cache, so gate requests read the prefix cache; judged against PEFT's aLoRA reference."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from gatehead.evals.agreement import agreement, shared_gate_probs
from gatehead.evals.stability import check_stability
from gatehead.evals.workload import synthetic_prompts, synthetic_requests
from gatehead.gate.reference import HFReference
from gatehead.runtime.canary import Canaries, CanaryConfig, GateRecord
from gatehead.runtime.dtype import resolve_dtype
from gatehead.runtime.engine import SharedEngine

SUFFIX_LENGTH = 3  # tiny_suffix's (tests/conftest.py)
HOST_DTYPE = resolve_dtype("auto")
BLOCK = 32


@pytest.fixture(scope="module")
def fp32(suffix_engines) -> SharedEngine:
    return suffix_engines(dtype="float32")


@pytest.fixture(scope="module")
def host(suffix_engines, fp32) -> SharedEngine:
    """The engine in the host's dtype (dtype auto): bf16 where native; where that is fp32, `fp32` itself."""
    return fp32 if HOST_DTYPE == "float32" else suffix_engines()


def probs_of(outcomes) -> np.ndarray:
    return np.array([[o.result.probs[k] for k in ("answer", "refuse", "search")] for o in outcomes])


def cap(prompt: tuple[int, ...]) -> int:
    """The most prefix-cache tokens a suffix-mode gate may read: whole blocks before its suffix."""
    return (len(prompt) - SUFFIX_LENGTH) // BLOCK * BLOCK


def gate_in_turn(engine: SharedEngine, loop, prompts, reset_each: bool = False):
    """Gate the prompts one after another (each after a cache reset with `reset_each`)."""
    async def run():
        outcomes = []
        for prompt in prompts:
            if reset_each:
                assert await engine.reset_prefix_cache()
            outcomes.append(await engine.gate_prompt(prompt))
        return outcomes

    return loop.run(run())


def test_fp32_suffix_gate_matches_its_reference_uncached_partly_and_fully_cached(fp32, loop, tiny_suffix) -> None:
    gates = synthetic_prompts(fp32.prompts, 48, 3)
    reference = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir, "float32").gate_probs(gates)
    uncached = gate_in_turn(fp32, loop, gates, reset_each=True)
    assert loop.run(fp32.reset_prefix_cache())
    partly = gate_in_turn(fp32, loop, gates)  # the prompts share their opening: later ones hit part of it
    fully = gate_in_turn(fp32, loop, gates)  # the same prompts again: every whole block before the suffix
    assert all(o.num_cached_tokens == 0 for o in uncached)
    assert sum(0 < o.num_cached_tokens < cap(g) for o, g in zip(partly, gates, strict=True)) >= len(gates) // 2
    assert [o.num_cached_tokens for o in fully] == [cap(g) for g in gates]
    figures = {name: float(np.abs(probs_of(outcomes) - reference).max())
               for name, outcomes in (("uncached", uncached), ("partly cached", partly), ("fully cached", fully))}
    print("fp32 suffix-mode gate vs HF aLoRA fp32, max |dp|: " + ", ".join(f"{k} {v:.2e}" for k, v in figures.items()))
    assert all(value <= 1e-4 for value in figures.values()), figures


def test_a_branch_blind_to_the_cached_prefix_fails_the_reference_comparison(suffix_engines, loop, tiny_suffix) -> None:
    control = suffix_engines(dtype="float32", branch="suffix-only")
    gates = synthetic_prompts(control.prompts, 48, 3)
    reference = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir, "float32").gate_probs(gates)
    delta = float(np.abs(probs_of(gate_in_turn(control, loop, gates)) - reference).max())
    print(f"negative control (suffix attends to itself only) vs HF fp32: max |dp| {delta:.3f}")
    assert delta > 100 * 1e-4, "the comparison must catch a branch that ignores the cached K/V"


@pytest.mark.skipif(HOST_DTYPE != "bfloat16", reason="a bf16 rule: this CPU emulates bf16, so engines run fp32 "
                    "here, and the fp32 suffix gate is judged against HF fp32 within 1e-4 (the tests above)")
def test_bf16_suffix_gate_beside_generations_is_within_bf16_of_fp32(host, loop, tiny_suffix) -> None:
    """A random adapter's decisions sit on its thresholds: judged on |dp| against this machine's own bf16."""
    gates = synthetic_prompts(host.prompts, 256, 4)
    answers = [host.prompts.build(r.question, r.passages).answer for r in synthetic_requests(32, seed=5)]
    shared = loop.run(shared_gate_probs(host, gates, answers))
    fp32 = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir, "float32").gate_probs(gates)
    hf_bf16 = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir, "bfloat16").gate_probs(gates)
    thresholds = tiny_suffix.adapter.spec.thresholds
    engine_dp, rounding = np.abs(shared - fp32).max(axis=1), np.abs(hf_bf16 - fp32).max(axis=1)
    print(f"bf16 suffix gate vs HF fp32: {agreement(shared, fp32, thresholds)}\n"
          f"HF bf16 vs HF fp32: {agreement(hf_bf16, fp32, thresholds)}")
    # The engine and HF are two bf16 computations of one gate: neither strays further than twice the other.
    assert engine_dp.max() <= 2 * rounding.max() and engine_dp.mean() <= 2 * rounding.mean()


def test_stability_with_suffix_gates_in_the_batches(stock_eager, host, loop) -> None:
    answers = [host.prompts.build(r.question, r.passages, r.conversation).answer for r in synthetic_requests(64, 1)]
    result = loop.run(check_stability(stock_eager, host, answers, 128, synthetic_prompts(host.prompts, 64, 2)))
    print(f"eager mixed, suffix-mode gates: {result}")
    assert result.passed, result


def test_chunked_into_16_token_steps_and_preempted_gates_give_the_same_probabilities(suffix_engines, host,
                                                                                   loop) -> None:
    item = {"bfloat16": 2, "float32": 4}[HOST_DTYPE]
    block_bytes = BLOCK * 6 * 2 * 2 * 32 * item  # tokens x layers x (K, V) x kv heads x head dim x dtype bytes
    cramped = suffix_engines(max_num_batched_tokens=16, max_num_seqs=8, kv_cache_memory_bytes=24 * block_bytes,
                             max_model_len=512)
    gates = synthetic_prompts(host.prompts, 24, 6)
    assert max(len(g) for g in gates) > 8 * 16
    assert loop.run(host.reset_prefix_cache())
    expected = probs_of(gate_in_turn(host, loop, gates, reset_each=True))
    answers = [host.prompts.build(r.question, r.passages).answer for r in synthetic_requests(12, seed=7)]

    async def crowded():
        work = [cramped.gate_prompt(g) for g in gates] + [cramped.generate(a, max_tokens=64, ignore_eos=True)
                                                          for a in answers]
        return (await asyncio.gather(*work))[: len(gates)]

    async def cut():
        """The gates alone, with vLLM's forced preemption of every running request (the prefix cache
        dropped too) while one of them is prefilling, until a gate's prefill was cut and started over."""
        pending = [asyncio.ensure_future(cramped.gate_prompt(g)) for g in gates]
        start = (await cramped.stats())["gate_restarts"]
        while not all(t.done() for t in pending) and (await cramped.stats())["gate_restarts"] == start:
            await asyncio.sleep(0.05)
            await cramped.llm.reset_prefix_cache(reset_running_requests=True)
        return await asyncio.gather(*pending)

    before = loop.run(cramped.stats())
    mixed = loop.run(crowded())
    middle = loop.run(cramped.stats())
    preempted = loop.run(cut())
    after = loop.run(cramped.stats())
    deltas = [float(np.abs(probs_of(got) - expected).max()) for got in (mixed, preempted)]
    print(f"16-token steps beside generations: {middle['preemptions'] - before['preemptions']:.0f} preemptions, "
          f"cache read by {sum(o.num_cached_tokens > 0 for o in mixed)} of {len(gates)} gates, vs uncached max |dp| "
          f"{deltas[0]:.2e}; gates preempted: {after['gate_restarts'] - middle['gate_restarts']:.0f} prefills started "
          f"over, vs uncached max |dp| {deltas[1]:.2e}")
    assert middle["preemptions"] > before["preemptions"], "the KV pool was meant to force preemption"
    assert sum(o.num_cached_tokens > 0 for o in mixed) >= len(gates) // 2
    assert after["gate_restarts"] > middle["gate_restarts"], "a gate's prefill was meant to be cut"
    assert max(deltas) <= 1e-3, deltas


def test_kv_fault_drill_moves_suffix_gates_and_the_canaries_catch_it(host, loop, caplog) -> None:
    canaries = Canaries(host, CanaryConfig(interval=0))
    loop.run(canaries.record())
    gate_canaries = {name for name, r in canaries.records.items() if isinstance(r, GateRecord)}
    assert len(gate_canaries) == 3, canaries.records
    assert loop.run(canaries.check()) == []  # their prefixes are cached now
    try:
        loop.run(host.inject_fault("kv", -1.0))  # every cached block's keys and values negated
        with caplog.at_level(logging.ERROR, logger="gatehead.canary"):
            mismatches = loop.run(canaries.check())
        assert gate_canaries <= {m.canary for m in mismatches}, mismatches
    finally:
        assert loop.run(host.reset_prefix_cache())
    assert loop.run(canaries.check()) == []


def test_the_prefix_cache_read_stops_before_the_suffix_and_is_reported(host, loop) -> None:
    # A suffix across a block boundary: vLLM alone would read the block holding the suffix's first tokens.
    prompt = next(p for p in synthetic_prompts(host.prompts, 400, 8) if len(p) % BLOCK == 1 and len(p) > 4 * BLOCK)
    assert cap(prompt) < (len(prompt) - 1) // BLOCK * BLOCK
    assert loop.run(host.reset_prefix_cache())
    first, again = gate_in_turn(host, loop, [prompt, prompt])
    assert first.num_cached_tokens == 0 and again.num_cached_tokens == cap(prompt) > 0
    assert again.result.probs == pytest.approx(first.result.probs, abs=1e-3)
    # A generation over the gate prompt's opening fills the cache too; the gate then reads it.
    opening = list(prompt[: 3 * BLOCK])
    assert loop.run(host.reset_prefix_cache())
    loop.run(host.generate(opening, max_tokens=1))
    [after] = gate_in_turn(host, loop, [prompt])
    assert after.num_cached_tokens == 3 * BLOCK
    assert after.result.probs == pytest.approx(first.result.probs, abs=1e-3)


def test_a_suffix_gate_engine_refuses_an_unreadable_kv_cache_at_start(suffix_engines) -> None:
    with pytest.raises(ValueError, match="'vec16' KV layout"):  # 16-token blocks select vLLM's vec16 CPU layout
        suffix_engines(block_size=16)
    # An FP8 cache at vLLM's default block size, refused before any process starts, naming the fix: by
    # gatehead's layout check where vLLM runs FP8 KV on this CPU (x86 with AVX-512 or AMX), by vLLM's own
    # refusal, turned into the same kind of error, on an AVX2 CPU (gatehead's check of the layout itself is
    # proven on every host by tests/integration/runtime/test_paged_kv.py).
    import torch

    avx512 = torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()
    with pytest.raises(ValueError, match="kv_cache_dtype='fp8'") as refused:
        suffix_engines(block_size=None, extra={"kv_cache_dtype": "fp8"})
    assert ("is not readable" if avx512 else "FP8 KV cache on CPU requires") in str(refused.value)
    with pytest.raises(ValueError, match="kv_offloading_size would load them"):
        suffix_engines(extra={"kv_offloading_size": 1.0})


def test_compile_mode_suffix_gate_matches_its_reference_beside_generations(compiled_suffix, loop, tiny_suffix) -> None:
    compiled = compiled_suffix("float32")
    gates = synthetic_prompts(compiled.prompts, 32, 9)
    answers = [compiled.prompts.build(r.question, r.passages).answer for r in synthetic_requests(16, seed=10)]
    mixed = loop.run(shared_gate_probs(compiled, gates, answers))
    cached = gate_in_turn(compiled, loop, gates)
    assert [o.num_cached_tokens for o in cached] == [cap(g) for g in gates]
    reference = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir, "float32").gate_probs(gates)
    figures = (float(np.abs(mixed - reference).max()), float(np.abs(probs_of(cached) - reference).max()))
    print(f"compile mode, fp32 suffix gate vs HF fp32: beside generations {figures[0]:.2e}, cached {figures[1]:.2e}")
    assert max(figures) <= 1e-4, figures


def test_suffix_gate_under_tp2_reads_each_ranks_kv_shard(suffix_engines, cpu_binding, loop, tiny_suffix) -> None:
    with cpu_binding(2):
        two = suffix_engines(dtype="float32", extra={"tensor_parallel_size": 2})
    gates = synthetic_prompts(two.prompts, 32, 11)
    first, cached = gate_in_turn(two, loop, gates), gate_in_turn(two, loop, gates)
    assert [o.num_cached_tokens for o in cached] == [cap(g) for g in gates]
    reference = HFReference(tiny_suffix.model_dir, tiny_suffix.adapter_dir, "float32").gate_probs(gates)
    figures = [float(np.abs(probs_of(o) - reference).max()) for o in (first, cached)]
    print(f"TP=2 fp32 suffix gate vs HF fp32: first {figures[0]:.2e}, cached {figures[1]:.2e}")
    assert max(figures) <= 1e-4, figures


def test_suffix_gates_batched_in_one_pass_equal_each_gated_alone(host, loop, alone_and_together) -> None:
    """Cached prefixes shared between the batch's requests included: their blocks are read once."""
    prompts = synthetic_prompts(host.prompts, 16, 8)
    assert loop.run(host.reset_prefix_cache())
    gate_in_turn(host, loop, prompts)  # every prefix cached: both runs below read the same blocks
    alone, together, per_pass = loop.run(alone_and_together(host, prompts))
    delta = float(np.abs(alone - together).max())
    print(f"suffix mode: {per_pass:.1f} gate prompts per branch pass; batched vs alone max |dp| {delta:.2e}")
    assert per_pass >= 2, "the gates arrived together: their branch passes must be shared"
    assert delta <= 1e-3
