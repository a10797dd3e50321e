"""Answer stability: greedy generations of the shared engine against the stock engine.

The rule (DESIGN): N greedy requests (max_tokens 128, ignore_eos), submitted together, run on the
stock engine twice and on the shared engine, prefix cache reset between passes. Count requests
with any differing token, the first differing positions, and max |delta logprob| over the tokens
both runs share. Pass iff shared-vs-stock differs in no more requests than stock-vs-stock, and,
where the stock repeats are bit-identical, the shared engine is bit-identical too.
Mixed batches: gate requests interleaved with the generations; the stock baseline interleaves
the same prompts as gate-shaped requests (one token, the action tokens' logprobs asked for, the
prefix cache not read) that no branch serves.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from gatehead.runtime.engine import Generation, SharedEngine


@dataclass(frozen=True)
class Diff:
    """How two passes over the same prompts differ."""

    requests: int
    differing: int  # requests with any differing token
    first_positions: tuple[int, ...]  # first differing token position, per differing request
    max_abs_dlogprob: float  # over the tokens both passes agree on, up to the first difference

    @property
    def bit_identical(self) -> bool:
        return self.differing == 0 and self.max_abs_dlogprob == 0.0


@dataclass(frozen=True)
class StabilityResult:
    stock_vs_stock: Diff
    shared_vs_stock: Diff

    @property
    def passed(self) -> bool:
        if self.shared_vs_stock.differing > self.stock_vs_stock.differing:
            return False
        return self.shared_vs_stock.bit_identical or not self.stock_vs_stock.bit_identical


def compare(a: Sequence[Generation], b: Sequence[Generation]) -> Diff:
    """Token and logprob differences between two passes, request by request."""
    assert len(a) == len(b), "passes over different prompt sets"
    firsts, max_delta = [], 0.0
    for x, y in zip(a, b, strict=True):
        first = next((i for i, (s, t) in enumerate(zip(x.token_ids, y.token_ids, strict=False)) if s != t), None)
        if first is None and len(x.token_ids) != len(y.token_ids):
            first = min(len(x.token_ids), len(y.token_ids))
        common = first if first is not None else len(x.token_ids)
        for p, q in zip(x.logprobs[:common], y.logprobs[:common], strict=False):
            max_delta = max(max_delta, abs(p - q))
        if first is not None:
            firsts.append(first)
    return Diff(len(a), len(firsts), tuple(firsts), max_delta)


async def _gate_like(engine: SharedEngine, ids: Sequence[int], action_ids: Sequence[int]) -> None:
    """On a stock engine: the same request shape as a gate request (the action tokens' logprobs asked
    for, the prefix cache not read), without the gate."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(action_ids),
                            skip_reading_prefix_cache=True, detokenize=False)
    async for _ in engine.llm.generate({"prompt_token_ids": list(ids)}, params, request_id=f"like-{uuid.uuid4().hex}"):
        pass


async def generation_pass(engine: SharedEngine, prompts: Sequence[Sequence[int]], max_tokens: int = 128,
                          gate_prompts: Sequence[Sequence[int]] = (), action_ids: Sequence[int] = (),
                          gates_may_fail: bool = False) -> list[Generation]:
    """All `prompts` generated greedily, submitted together, interleaved with `gate_prompts` if any
    (on a stock engine, as gate-shaped requests asking for `action_ids`' logprobs). `gates_may_fail`:
    a diagnostic engine without its branch or tap, whose gate requests end in `GateError`."""
    from gatehead.runtime.engine import GateError

    await engine.reset_prefix_cache()
    generations = [engine.generate(p, max_tokens=max_tokens, ignore_eos=True) for p in prompts]
    gates = [engine.gate_prompt(g) if engine.adapter is not None else _gate_like(engine, g, action_ids)
             for g in gate_prompts]
    interleaved = [c for pair in zip(generations, gates, strict=False) for c in pair]
    interleaved += generations[len(gates):] + gates[len(generations):]
    results = await engine.together(interleaved)
    for r in results:
        if isinstance(r, BaseException) and not (gates_may_fail and isinstance(r, GateError)):
            raise r
    return [r for r in results if isinstance(r, Generation)]


async def check_stability(stock: SharedEngine, shared: SharedEngine, prompts: Sequence[Sequence[int]],
                          max_tokens: int = 128, gate_prompts: Sequence[Sequence[int]] = ()) -> StabilityResult:
    """Stock twice, then shared, over the same prompts (and the same interleaved gate prompts)."""
    first = await generation_pass(stock, prompts, max_tokens, gate_prompts, shared.action_ids)
    second = await generation_pass(stock, prompts, max_tokens, gate_prompts, shared.action_ids)
    shared_pass = await generation_pass(shared, prompts, max_tokens, gate_prompts)
    return StabilityResult(compare(first, second), compare(first, shared_pass))


def prompt_builder(model_dir, adapter_dir, max_context: int):
    """(the engine's prompt layout for this model and adapter, the adapter's action token ids)."""
    from transformers import AutoTokenizer

    from gatehead.gate.adapter import load_gate_adapter
    from gatehead.gate.prompt import PromptBuilder, PromptConfig, reserved_token_id

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    spec = load_gate_adapter(adapter_dir, model_dir).spec
    return (PromptBuilder(tokenizer, spec.suffix, PromptConfig(max_context=max_context)),
            [reserved_token_id(tokenizer, t) for t in spec.action_tokens])


def build_prompts(builder, n: int, seed: int, kind: str) -> list[tuple[int, ...]]:
    """`n` deterministic synthetic prompts of `kind` ("answer" or "gate"), laid out by `builder`."""
    from gatehead.evals.workload import synthetic_requests

    return [tuple(getattr(builder.build(r.question, r.passages, r.conversation), kind))
            for r in synthetic_requests(n, seed)]


def _shutdown(engine: SharedEngine, loop: asyncio.AbstractEventLoop) -> None:
    """Stop `engine`, then let its cancelled output task finish in its loop (else it dies pending at close)."""
    engine.shutdown()
    loop.run_until_complete(asyncio.sleep(0.1))


VARIANTS = ("plain", "mixed", "tap-only", "no-tap")
DIAGNOSTICS = {"tap-only": {"branch": False}, "no-tap": {"tap": "off"}}


def run_stability(config, n: int = 64, max_tokens: int = 128, variants: Sequence[str] = VARIANTS, out=None):
    """The stability eval (`gatehead eval stability`): every variant, judged by the rule; an `Outcome`."""
    unknown = set(variants) - set(VARIANTS)
    if unknown or not variants:
        raise ValueError(f"unknown stability variants {sorted(unknown)}; choose from {list(VARIANTS)}")
    if config.dtype not in ("bfloat16", "float32"):
        raise ValueError(f"the stability rule is judged in the host's dtype, bf16 or fp32, not {config.dtype}")
    builder, action_ids = prompt_builder(config.model, config.adapter, config.max_model_len or 2048)
    answers, gates = build_prompts(builder, n, 1, "answer"), build_prompts(builder, n, 2, "gate")
    stock, measured = _measure(config, answers, {"plain": (), "mixed": gates}, action_ids, variants, max_tokens)
    return _judged(config, variants, stock, measured, n, max_tokens, out)


def _measure(config, answers, workloads: dict, action_ids, variants: Sequence[str], max_tokens: int):
    """Two passes of each needed workload on a stock engine, then each variant on its engine: ((first, second),
    {variant: its pass})."""
    from dataclasses import replace

    from tqdm import tqdm

    needed = sorted({"plain" if v == "plain" else "mixed" for v in variants})
    progress = tqdm(total=2 * len(needed) + len(variants), desc="stability passes", unit="pass")
    loop = asyncio.new_event_loop()  # one loop for every pass: an engine binds to the loop it first runs in

    def warm_up(engine) -> None:
        """One unmeasured pass: a cold engine's first steps are slow, so requests submitted together
        can land in different steps (other batch shapes, other bf16 sums) on a loaded machine."""
        loop.run_until_complete(generation_pass(engine, answers, 8, workloads["mixed" if "mixed" in needed else
                                                                               "plain"], action_ids,
                                                gates_may_fail=True))

    def passes(engine, names):
        out = {}
        for workload in names:
            out[workload] = loop.run_until_complete(generation_pass(engine, answers, max_tokens, workloads[workload],
                                                                    action_ids))
            progress.update()
        return out

    stock = SharedEngine(replace(config, adapter=None))
    try:
        warm_up(stock)
        first, second = passes(stock, needed), passes(stock, needed)
    finally:
        _shutdown(stock, loop)
    measured = {}
    engine_variants = [("shared", {}, [v for v in ("plain", "mixed") if v in variants])]
    engine_variants += [(v, DIAGNOSTICS[v], [v]) for v in ("tap-only", "no-tap") if v in variants]
    for _, overrides, names in engine_variants:
        if not names:  # only diagnostics asked for: no shared engine
            continue
        engine = SharedEngine(replace(config, **overrides))
        try:
            warm_up(engine)
            for name in names:
                workload = "plain" if name == "plain" else "mixed"
                measured[name] = loop.run_until_complete(generation_pass(
                    engine, answers, max_tokens, workloads[workload], gates_may_fail=name in DIAGNOSTICS))
                progress.update()
        finally:
            _shutdown(engine, loop)
    loop.close()
    progress.close()
    return (first, second), measured


def _judged(config, variants: Sequence[str], stock: tuple[dict, dict], measured: dict, n: int, max_tokens: int, out):
    """Each variant against the stock repeats, by the rule: the eval's `Outcome`, report and plot."""
    from dataclasses import asdict

    from gatehead.evals.plots import paired_bars
    from gatehead.evals.run import Outcome, table

    first, second = stock
    rows, results = [], {}
    for name in variants:
        workload = "plain" if name == "plain" else "mixed"
        result = StabilityResult(compare(first[workload], second[workload]), compare(first[workload], measured[name]))
        results[name] = {"passed": result.passed, "stock_vs_stock": asdict(result.stock_vs_stock),
                         "shared_vs_stock": asdict(result.shared_vs_stock), "judged": name in ("plain", "mixed")}
        s, m = result.stock_vs_stock, result.shared_vs_stock
        rows.append([name, "yes" if name in ("plain", "mixed") else "diagnostic", s.differing, m.differing,
                     ", ".join(map(str, m.first_positions[:8])) or "-", s.max_abs_dlogprob, m.max_abs_dlogprob,
                     "pass" if result.passed else "FAIL"])
    judged = [results[v]["passed"] for v in variants if results[v]["judged"]]
    passed = all(judged)  # a diagnostics-only run is judged on nothing: it passes, and its report says so
    plot = paired_bars(out / "stability.png", list(variants),
                       [results[v]["stock_vs_stock"]["differing"] for v in variants],
                       [results[v]["shared_vs_stock"]["differing"] for v in variants],
                       "stock vs stock (repeat baseline)", "shared vs stock", f"requests differing (of {n})",
                       "Answer stability")
    report = (f"{n} greedy requests, max_tokens {max_tokens}, ignore_eos, {config.dtype}, "
              f"{'eager' if config.enforce_eager else 'compile'} mode; model `{config.model}`.\n\n"
              + table(["variant", "judged", "stock-vs-stock differing", "shared-vs-stock differing",
                       "first differing positions", "stock max abs dlogprob", "shared max abs dlogprob",
                       "verdict"], rows))
    summary = {v: {"stock": results[v]["stock_vs_stock"]["differing"],
                   "shared": results[v]["shared_vs_stock"]["differing"], "passed": results[v]["passed"]}
               for v in variants}
    return Outcome(passed, {"n": n, "max_tokens": max_tokens, "variants": results}, report, [plot], summary)
