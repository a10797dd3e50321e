"""What sharing the backbone buys, measured side by side on one machine (`gatehead bench`).

The setups serve the same agent (`gatehead.agent.Agent`: retrieve -> gate -> answer) on the same model,
the same retrieval store, the same KV memory and the same cores (`gatehead.benchmarks.peers`):
- (a) shared, prompt-mode gate: one `SharedEngine` with the prompt-mode adapter (the gate branches
  off at layer N-k and recomputes its whole prompt);
- (a') shared, suffix-mode gate: one `SharedEngine` with the suffix-mode (activated) adapter of the
  same gate task (the gate reads the prefix cache and computes its suffix);
- (a'-overlap) (a') with the answer submitted beside the gate and held until it decides
  (`AgentConfig.answer_beside_gate`, `gatehead.agent.held`);
- (a'-remote) (a')'s gate and engine inside vLLM's own OpenAI server (`vllm serve` with `gatehead
  vllm-args`' flags, on the same cores and KV memory), the agent on `RemoteEngine` over loopback HTTP;
- (b) two engines: stock vLLM for generation beside the dedicated gate engine (`gatehead
  export-dedicated` on stock vLLM's pooling runner, prefix caching on), each with half the KV memory,
  in two bindings: `split` (half the cores each) and `shared` (both on every core); a target against
  (b) is judged against its better binding at each concurrency;
- (c) plugin loaded, no gate: the shared engine (prompt-mode adapter loaded) answering every turn
  without a gate request;
- (c0) stock vLLM, no gate: an engine with gatehead's plugin left out (`stock_vllm`) answering every
  turn: the denominator of every end-to-end ratio; (c)/(c0) is the plugin's own cost;
- (d) prompted judge: a stock engine (no adapter) asked after the gate prompt's prefix whether to
  answer, refuse or search, scored on the label words' next-token logprobs (reads the prefix cache).
Every turn answers: the thresholds are set so every gate decides "answer" whatever the probabilities
say, so the setups do the same retrieval and generation work and differ only in the gate.

Workloads: single-turn turns at concurrency 1, 4 and 8 (turns/s, gate latency, answer time to first
token, end-to-end p50/p95); 5-turn threads (per turn of the thread); refused turns, (a') and
(a'-overlap) only, at each concurrency (thresholds that refuse every turn: what a refused turn costs,
and the decode tokens an answer started beside its gate wastes); prefix reuse, for gate prompts of 256
to 8,192 tokens (as the context allows): the gate's latency on a cold cache and after its prefix was
cached (by answering first), and the answer's time to first token cold and after a gate, for (a),
(a') and (d); memory (weights bytes, engine processes' resident memory, KV capacity of each engine at
the same memory fraction, and a stock engine's).
Every workload runs `runs` times (default 3) on each setup, in rounds (`rounds`): each round starts
every layout of engines afresh and runs each setup once, alternate rounds in reverse order, so no
setup always runs first or beside the same neighbour. Every figure is reported as the median with the
min and max over the runs, and so is every ratio (taken round by round: run i of one setup against
run i of another, so a ratio's min and max are wider than its parts'). `targets` judges the
issue's targets on the medians. Models: the demo model (`--model demo`), or a random-weight Qwen3
large enough that compute dominates overheads (`--model random`: Qwen2.5-0.5B's layers, 0.36 B
parameters, built on first use, with a prompt-mode and a suffix-mode random adapter). Prints tables,
writes JSON; asserts nothing.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from gatehead.benchmarks.agent_ttft import ttft
from gatehead.benchmarks.bench_report import PRIORITY, SETUP_NAMES, WORKLOADS, ratios, spread, tables, targets
from gatehead.benchmarks.layouts import OneEngine, RemoteLayout, TwoEngineLayout
from gatehead.benchmarks.peers import (
    ALWAYS_ANSWER,
    ALWAYS_REFUSE,
    PromptedJudge,
    SharedGate,
    Ungated,
)
from gatehead.gate.policy import LABELS
from gatehead.gate.prompt import Passage
from gatehead.provenance import machine
from gatehead.runtime.cpu_setup import cores_of
from gatehead.runtime.engine import SharedEngine

PREFIX_LENGTHS = (256, 512, 1024, 2048, 4096, 8192)
SETUPS = SETUP_NAMES
RANDOM_RECIPE = Path(__file__).with_name("random-model.json")  # the 0.36 B random model: its shape and suffix
BINDINGS = {"split": "b_split", "shared": "b_shared"}  # (b)'s core bindings and their setups
SPLIT_NEEDS_TWO = "(b) with --two-engine-cores split needs at least 2 cores in --cores (or give shared alone)"


@dataclass(frozen=True)
class BenchConfig:
    model: str | Path
    adapter: str | Path  # prompt mode: setups (a), and the prompt layout of (b), (d)
    suffix_adapter: str | Path | None = None  # suffix mode: setup (a'); None leaves (a') out
    memory_fraction: float = 0.1  # of what vLLM sizes KV from; (b) gives each of its engines half
    max_model_len: int = 2048
    block_size: int | None = None
    compile: bool = False
    cores: str = "0-1"  # the cores every setup uses (vLLM's VLLM_CPU_OMP_THREADS_BIND syntax: "0-1")
    # (b)'s bindings, each a setup: "split" (its engines get half the cores each), "shared" (both all)
    two_engine_cores: tuple[str, ...] = ("split", "shared")
    questions: int = 32  # single-turn turns per concurrency level (c=8 is then 4 batches' worth, not one)
    concurrency: tuple[int, ...] = (1, 4, 8)
    threads: int = 3  # 5-turn threads
    thread_turns: int = 5
    answer_tokens: int = 64
    prefix_repeats: int = 1  # per run, per prefix length
    runs: int = 3
    setups: tuple[str, ...] = tuple(SETUPS)
    workloads: tuple[str, ...] = WORKLOADS
    target_set: str = "random"  # whose targets judge the run: "random" (the 0.36 B model's) or "demo"
    dtype: str = "auto"  # every setup's, resolved once (runtime/dtype.py): bf16 where native, else fp32

    def __post_init__(self) -> None:
        from gatehead.runtime.dtype import resolve_dtype

        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        unknown = set(self.two_engine_cores) - set(BINDINGS)
        if unknown or not self.two_engine_cores:
            raise ValueError(f"two_engine_cores takes {sorted(BINDINGS)}, not {list(self.two_engine_cores)}")


# ----- workloads ------------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _turn_figures(result, seconds: float) -> dict:
    by_node: dict[str, float] = {}
    ttft, answer_tokens = None, 0
    for t in result.timings:
        by_node[t["node"]] = by_node.get(t["node"], 0.0) + t["seconds"]
        if t["node"] == "generate":
            ttft, answer_tokens = t.get("ttft"), t.get("completion_tokens", 0)
    if result.error:
        raise RuntimeError(f"a benchmark turn failed: decision {result.decision!r}, error {result.error!r}")
    answered = result.decision == "answer" and ttft is not None
    # A turn the model refuses (a pretrained model may, on a follow-up) is timed as it ran; the answer
    # figures (time to first token, tokens) are over the answered turns, whose count each summary gives.
    return {"seconds": seconds, "gate": by_node.get("gate", 0.0), "ttft": ttft if answered else None,
            "retrieve": by_node.get("retrieve", 0.0), "generate": by_node.get("generate", 0.0),
            "answer_tokens": answer_tokens if answered else 0, "answered": answered,
            "decision": result.gates[-1]["decision"] if result.gates else "",
            "wasted": sum(g.get("wasted_answer_tokens", 0) for g in result.gates)}


def _summary(turns: Sequence[dict], wall: float) -> dict:
    seconds = [t["seconds"] for t in turns]
    answered = [t for t in turns if t["answered"]]
    return {"turns": len(turns), "answered": len(answered), "wall_s": wall, "turns_per_s": len(turns) / wall,
            "e2e_p50_ms": 1000 * _percentile(seconds, 0.5), "e2e_p95_ms": 1000 * _percentile(seconds, 0.95),
            "gate_mean_ms": 1000 * statistics.mean(t["gate"] for t in turns),
            "ttft_mean_ms": 1000 * statistics.mean(t["ttft"] for t in answered) if answered else float("nan"),
            "retrieve_mean_ms": 1000 * statistics.mean(t["retrieve"] for t in turns),
            "generate_mean_ms": 1000 * statistics.mean(t["generate"] for t in turns),
            "answer_tokens_mean": statistics.mean(t["answer_tokens"] for t in answered) if answered else 0.0,
            "wasted_tokens_mean": statistics.mean(t["wasted"] for t in turns),
            "wasted_tokens_max": max(t["wasted"] for t in turns)}


async def _ask(agent, question: str, thread_id: str, answer_tokens: int) -> dict:
    started = time.perf_counter()
    result = await agent.ask(question, thread_id, max_answer_tokens=answer_tokens)
    return _turn_figures(result, time.perf_counter() - started)


async def single_turn(agent, questions: Sequence[str], concurrency: int, answer_tokens: int) -> dict:
    """`questions` as single-turn threads, `concurrency` in flight at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(q: str) -> dict:
        async with gate:
            return await _ask(agent, q, uuid.uuid4().hex, answer_tokens)

    started = time.perf_counter()
    turns = await asyncio.gather(*(one(q) for q in questions))
    out = _summary(turns, time.perf_counter() - started)
    out["gate_decisions"] = {label: sum(t["decision"] == label for t in turns) for label in LABELS}
    return out


async def multi_turn(agent, threads: Sequence[Sequence[str]], answer_tokens: int) -> dict:
    """Threads one after the other; figures per turn of the thread (turn 1 has no history)."""
    per_turn: list[list[dict]] = [[] for _ in threads[0]]
    started = time.perf_counter()
    for questions in threads:
        thread_id = uuid.uuid4().hex
        for i, q in enumerate(questions):
            per_turn[i].append(await _ask(agent, q, thread_id, answer_tokens))
    wall = time.perf_counter() - started
    return {"wall_s": wall, "turns": sum(len(t) for t in per_turn),
            "by_turn": [{"turn": i + 1, **{k: v for k, v in _summary(turns, wall).items()
                                           if k not in ("turns_per_s", "wall_s")}}
                        for i, turns in enumerate(per_turn)]}


def prefix_prompts(prompts, max_model_len: int, lengths: Sequence[int], corpus: Sequence[str]):
    """Per length: a question over passages cut from `corpus` so the gate prompt has about that many tokens."""
    question = "What does the last passage say about the warranty?"
    out = []
    for length in lengths:
        passages, words, i = [], [], 0
        prompt = prompts.build(question, [])
        while len(prompt.gate) < length and i < 100_000:
            words.append(corpus[i % len(corpus)])
            i += 1
            if len(words) == 40:
                passages.append(Passage(" ".join(words)))
                words = []
                prompt = prompts.build(question, passages)
        if prompt.dropped.passages or len(prompt.answer) + 1 > max_model_len:
            continue
        out.append((length, prompt))
    return out


async def prefix_reuse(setup, engine: SharedEngine, prompts, repeats: int) -> list[dict]:
    """Per gate prompt (prefix caches emptied first each time): the answer's TTFT cold, then the gate after
    that answer cached the prefix; the gate cold, then the answer's TTFT after it."""
    async def timed(call) -> tuple[float, Any]:
        started = time.perf_counter()
        outcome = await call
        return time.perf_counter() - started, outcome

    rows = []
    for length, prompt in prompts:
        cold, after_gate, gate_cold, gate_cached, cached = [], [], [], [], 0
        for _ in range(repeats):
            await engine.reset_prefix_cache()
            cold.append((await ttft(engine, prompt.answer))[0])
            seconds, outcome = await timed(setup.gate_laid_out(prompt))
            gate_cached.append(seconds)
            await engine.reset_prefix_cache()
            gate_cold.append((await timed(setup.gate_laid_out(prompt)))[0])
            seconds, cached = await ttft(engine, prompt.answer)
            after_gate.append(seconds)
        rows.append({"target_tokens": length, "gate_prompt_tokens": outcome.num_prompt_tokens,
                     "gate_cached_tokens": outcome.num_cached_tokens,
                     "answer_prompt_tokens": len(prompt.answer), "answer_cached_after_gate": cached,
                     "gate_cold_ms": 1000 * statistics.median(gate_cold),
                     "gate_cached_prefix_ms": 1000 * statistics.median(gate_cached),
                     "cold_ttft_ms": 1000 * statistics.median(cold),
                     "after_gate_ttft_ms": 1000 * statistics.median(after_gate)})
    return rows


# ----- the run -------------------------------------------------------------------------------------


def bench_questions(n: int, offset: int = 0) -> list[str]:
    """`n` answerable questions of the validation split from `offset` on, one per product first."""
    from gatehead.demo.splits import held_out_examples

    # The validation split's: the test split is read once per model, for its figures, not as load.
    answerable = [e.question for e in held_out_examples(("val",)) if e.label == "answer"]
    # One question per product first (the held-out set asks each fact twice, worded differently).
    seen, firsts = set(), []
    for q in answerable:
        key = q.rsplit(" the ", 1)[-1]
        if key not in seen:
            seen.add(key)
            firsts.append(q)
    pool = firsts + [q for q in answerable if q not in firsts]
    return pool[offset:offset + n]


async def _workloads(setup, engine: SharedEngine | None, config: BenchConfig, corpus: Sequence[str], reset,
                     store, agent_config, refusals: bool) -> dict:
    """The workloads on one setup; `reset()` empties its engines' prefix caches before each one, so no
    workload reads what an earlier one left (within a workload, turns share prefixes as real traffic does).
    `engine`: where the prefix-reuse workload answers (None: not run on this setup); `refusals`: whether
    the refused-turns workload runs on it."""
    from gatehead.agent import Agent

    agent = Agent(setup, store, agent_config)
    out: dict = {}
    warmup = bench_questions(2, offset=200)
    await single_turn(agent, warmup, 2, config.answer_tokens)  # first-request costs out of the figures
    questions = bench_questions(config.questions)
    if "single" in config.workloads:
        for c in config.concurrency:
            await reset()
            out[f"single_c{c}"] = await single_turn(agent, questions, c, config.answer_tokens)
    if "multi" in config.workloads:
        pool = bench_questions(config.threads * config.thread_turns, offset=config.questions)
        threads = [pool[i * config.thread_turns:(i + 1) * config.thread_turns] for i in range(config.threads)]
        await reset()
        out["multi_turn"] = await multi_turn(agent, threads, config.answer_tokens)
    if "refuse" in config.workloads and refusals:
        refusing = Agent(setup, store, replace(agent_config, thresholds=ALWAYS_REFUSE))
        for c in config.concurrency:
            await reset()
            out[f"refuse_c{c}"] = await single_turn(refusing, questions, c, config.answer_tokens)
    if "prefix" in config.workloads and engine is not None:
        lengths = [n for n in PREFIX_LENGTHS if n < config.max_model_len]
        prompts = prefix_prompts(setup.prompts, config.max_model_len, lengths, corpus)
        out["prefix_reuse"] = await prefix_reuse(setup, engine, prompts, config.prefix_repeats)
    return out


def layouts(config: BenchConfig, adapter, export: Path) -> list:
    """The engine layouts `config.setups` run on, in the order they run (`gatehead.benchmarks.layouts`)."""
    from gatehead.agent import AgentConfig

    cores = cores_of(config.cores)
    if "split" in config.two_engine_cores and len(cores) < 2:
        raise ValueError(SPLIT_NEEDS_TWO)
    half = len(cores) // 2
    bindings = {"split": (cores[:half], cores[half:]), "shared": (cores, cores)}  # (generator, gate) cores
    answering = AgentConfig(thresholds=ALWAYS_ANSWER, max_answer_tokens=config.answer_tokens)
    beside = replace(answering, answer_beside_gate=True)
    ungated = (lambda e: Ungated(e, adapter), answering)
    wanted = set(config.setups)
    out = []
    for name, adapter_dir, setups in (
            ("shared_prompt", config.adapter, {"c_ungated": ungated}),
            ("shared_suffix", config.suffix_adapter, {"a_suffix": (SharedGate, answering),
                                                      "a_overlap": (SharedGate, beside)}),
            ("stock", None, {"c0_stock": ungated, "d_judge": (lambda e: PromptedJudge(e, adapter), answering)})):
        chosen = {k: v for k, v in setups.items() if k in wanted}
        # The memory workload reads the prompt-mode shared engine and the stock one even where no setup runs.
        if chosen or ("memory" in config.workloads and name != "shared_suffix" and
                      not (name == "shared_prompt" and "a_prompt" in wanted)):
            out.append(OneEngine(name, config, adapter_dir, cores, chosen))
    prioritised = {k: v for k, v in {"a_suffix_prio": (SharedGate, answering),
                                     "a_overlap_prio": (SharedGate, beside)}.items() if k in wanted}
    if prioritised:
        out.append(OneEngine("shared_suffix_priority", config, config.suffix_adapter, cores, prioritised, "priority"))
    out += [TwoEngineLayout(BINDINGS[b], config, adapter, export, *bindings[b], answering)
            for b in config.two_engine_cores if BINDINGS[b] in wanted]
    if "a_remote" in wanted:
        out.append(RemoteLayout(config, cores, answering, export.parent))
    if "a_prompt" in wanted:  # last: the slowest setup (it recomputes whole prompts of up to 8k tokens)
        out.append(OneEngine("shared_prompt", config, config.adapter, cores, {"a_prompt": (SharedGate, answering)}))
    return out


def rounds(layouts: Sequence, runs: int) -> list[list]:
    """The order the layouts run in, round by round: every round starts each layout afresh and runs one run of
    each of its setups; odd rounds run the layouts, and the setups within each, in reverse. No setup always runs
    first, on a machine that has just warmed up, or right after the same neighbour, and a ratio is taken between
    runs of one round, minutes apart rather than an hour. A layout with no setup (started for the memory
    workload alone) runs in the first round only."""
    return [[x for x in (layouts if i % 2 == 0 else reversed(layouts)) if i == 0 or x.keys] for i in range(runs)]


async def _measure(layout, config: BenchConfig, corpus, store, results: dict, log, on_setup,
                   backwards: bool) -> dict:
    """One run of every setup of a started `layout` (in reverse if `backwards`); the layout's memory figures."""
    measured = list(layout.measured())
    for setup in reversed(measured) if backwards else measured:
        log(SETUPS[setup.key])
        results.setdefault(setup.key, []).append(await _workloads(
            setup.peer, setup.prefix_engine, config, corpus, layout.reset, store, setup.agent_config,
            setup.refusals))
        if on_setup is not None:
            on_setup(results)
    return await layout.memory()


def run(config: BenchConfig, log=print, on_setup=None) -> dict:
    """Every setup in `config.setups`, its layouts of engines one after the other on this machine, `config.runs`
    rounds of them (`rounds`). `on_setup(results)`, if given, is called with the runs measured so far (setup ->
    runs) each time a setup finishes a run, so a stopped bench keeps what it measured."""
    from gatehead.demo.index import open_demo_store
    from gatehead.evals.kv import checkpoint_bytes
    from gatehead.gate.adapter import load_gate_adapter

    unknown = set(config.setups) - set(SETUPS)
    if unknown or (config.suffix_adapter is None and {"a_suffix", "a_overlap", "a_remote", *PRIORITY}
                   & set(config.setups)):
        raise ValueError(f"setups are {list(SETUPS)} (the suffix-mode ones need a suffix-mode adapter), not "
                         f"{sorted(config.setups)}")
    adapter = load_gate_adapter(config.adapter, config.model)
    results: dict[str, list[dict]] = {}
    memory: dict = {}
    with tempfile.TemporaryDirectory(prefix="gatehead-bench-") as tmp:
        store = open_demo_store(Path(tmp) / "qdrant", log=lambda *_: None)
        try:
            corpus = " ".join(h.text for h in store.search("warranty price weight colour", top_k=20)).split()
            for i, order in enumerate(rounds(layouts(config, adapter, Path(tmp) / "dedicated"), config.runs)):
                log(f"round {i + 1}/{config.runs}")
                for layout in order:
                    layout.start()
                    try:  # one event loop for the layout's life in this round
                        figures = asyncio.run(_measure(layout, config, corpus, store, results, log, on_setup,
                                                       backwards=i % 2 == 1))
                    finally:
                        layout.shutdown()
                    if i == 0:  # the first round's
                        memory[layout.name] = figures
        finally:
            store.close()
    if "memory" in config.workloads:
        base = checkpoint_bytes(config.model, config.dtype)  # as the engines hold it, not as stored
        memory["weights_bytes"] = {
            "one_engine": base + memory["shared_prompt"]["plugin_bytes"].get("lora_and_head", 0),
            "two_engines": base + memory.get("two_engines", {}).get("dedicated_weights_bytes", float("nan"))}
        for name in ("shared_prompt", "shared_suffix"):
            if name in memory:
                memory[f"kv_ratio_{name}_vs_stock"] = memory[name]["kv_tokens"] / memory["stock"]["kv_tokens"]
    runs = [{key: results[key][i] for key in results} for i in range(config.runs)]
    figures = {"runs": runs, "setups": spread(runs), "ratios": spread([ratios(r) for r in runs]), "memory": memory,
               "target_set": config.target_set}
    figures["targets"] = targets(figures)
    return figures


def random_model(directory: Path) -> tuple[Path, Path, Path]:
    """The 0.36 B random model and its random prompt-mode and suffix-mode gate adapters under `directory`: built
    from `RANDOM_RECIPE` by `gatehead.tiny` once, and again whenever the recipe or the builder changed (the
    folder keeps what it was built from)."""
    import shutil

    from gatehead import tiny
    from gatehead.digest import fingerprint

    recipe = json.loads(RANDOM_RECIPE.read_text())
    wanted = {"shape": recipe["shape"], "suffix_length": recipe["suffix_length"],
              "builder": fingerprint(Path(tiny.__file__))}
    model, adapter, suffix = directory / "model", directory / "adapter", directory / "suffix" / "adapter"
    stamp = directory / "built-from.json"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return model, adapter, suffix
    shutil.rmtree(directory, ignore_errors=True)
    tiny.build_tiny(directory, tiny.TinySpec(**recipe["shape"]))
    built = tiny.build_tiny(directory / "suffix", tiny.TinySpec(**recipe["shape"], activation="suffix",
                                                                suffix_length=recipe["suffix_length"]))
    # The same seed builds the same base: the suffix adapter is fitted to `model`, byte for byte.
    assert (built.model_dir / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    stamp.write_text(json.dumps(wanted, indent=2) + "\n")
    return model, adapter, suffix


def bench_models(model: str, random_dir: Path, adapter: Path | None = None, suffix_adapter: Path | None = None,
                 max_model_len: int | None = None) -> tuple[Path, Path, Path | None, int]:
    """(model, prompt-mode adapter, suffix-mode adapter or None, window) of `gatehead bench --model`: "demo"
    (built on first use), "random" (built on first use under `random_dir`) or a model folder with its adapters."""
    from gatehead.demo import ADAPTER_DIR, SUFFIX_ADAPTER_DIR
    from gatehead.demo.base import ensure_demo_model

    if model == "demo":
        return ensure_demo_model(), ADAPTER_DIR, SUFFIX_ADAPTER_DIR, max_model_len or 2048
    if model == "random":
        return (*random_model(Path(random_dir)), max_model_len or 8192 + 512)
    return Path(model), Path(adapter), Path(suffix_adapter) if suffix_adapter else None, max_model_len or 2048


def default_setups(suffix_adapter: Path | None, bindings: Sequence[str]) -> tuple[str, ...]:
    """Every setup that can run: (a') and (a'-overlap) need a suffix-mode adapter; (b) in `bindings`; the
    priority-scheduler setups only when asked for."""
    return tuple(s for s in SETUPS if s not in PRIORITY and (s not in ("a_suffix", "a_overlap", "a_remote")
                                                              or suffix_adapter)
                 and (s not in BINDINGS.values() or s in (BINDINGS[b] for b in bindings)))


def bench(config: BenchConfig, model_name: str, out: Path | None = None) -> int:
    """`gatehead bench` (the CLI builds `config`): runs it, prints the tables, writes `out` (JSON) and the
    tables beside it, and the setups finished so far to `<out>.partial.json` as it goes."""
    started = time.time()
    header = {"command": " ".join(["gatehead", *sys.argv[1:]]), "machine": machine(), "model": model_name,
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}}
    partial = Path(out).with_suffix(".partial.json") if out else None
    if partial is not None:
        partial.parent.mkdir(parents=True, exist_ok=True)

    def keep(results: dict) -> None:  # the runs finished so far: the tables need every setup's
        partial.write_text(json.dumps({**header, "runs_finished": {k: len(v) for k, v in results.items()},
                                       "runs_by_setup": results},
                                      indent=2) + "\n")

    figures = run(config, on_setup=keep if partial is not None else None)
    result = {**header, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "seconds": round(time.time() - started, 1), **figures}
    text = tables(figures)
    print(text)
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
        Path(out).with_suffix(".md").write_text(text)
        if partial is not None and partial.exists():
            partial.unlink()
    return 0
