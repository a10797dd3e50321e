"""What sharing the backbone buys, measured side by side on one machine (`gatehead bench`).

Three setups serve the same agent (`gatehead.agent.Agent`: retrieve -> gate -> answer) on the same
model, the same retrieval store, the same KV memory and the same cores:
- (a) shared: one `SharedEngine` with the gate adapter (the gate branches off at layer N-k);
- (b) two engines: stock vLLM for generation (`SharedEngine` without an adapter) beside the dedicated
  gate engine (`gatehead export-dedicated` served by stock vLLM's pooling runner), each with half the
  KV memory and, by default, half the cores (`--two-engine-cores shared`: both on all cores);
- (c) ungated: the engine of (a) answering every turn without a gate.
Every turn answers: the thresholds are set so (a) and (b) decide "answer" whatever the
probabilities say, so the three setups do the same retrieval and generation work and differ only
in the gate. The gate still runs in full in (a) and (b) and its decisions are counted.

Workloads: single-turn turns at concurrency 1 and 4 (turns/s, gate latency, answer time to first
token, end-to-end p50/p95); 5-turn threads (per turn of the thread); prefix reuse (the answer's time
to first token after a gate on the same prefix vs cold, for prefixes of 256 to 4k tokens, on the
shared engine); memory (weights bytes, engine processes' resident memory, KV capacity of each engine
at the same memory fraction, and a stock engine's at the shared engine's fraction).
Models: the demo model (`--model demo`), or a random-weight Qwen3 large enough that compute
dominates overheads (`--model random`: Qwen2.5-0.5B's layers, 0.36 B parameters, built on first
use). Prints tables, writes JSON; asserts nothing (the targets are judged in the README, by hand).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from gatehead.benchmarks.agent_ttft import ttft
from gatehead.gate.policy import LABELS, Thresholds, gate_result
from gatehead.gate.prompt import Passage, PromptBuilder, PromptConfig
from gatehead.runtime.engine import EngineConfig, GateOutcome, SharedEngine, _last

ALWAYS_ANSWER = Thresholds(answer=0.0, refuse=1.0)
PREFIX_LENGTHS = (256, 512, 1024, 2048, 4096)
# Qwen2.5-0.5B's layer shape (24 layers; 0.36 B parameters with the tiny tokenizer's vocabulary):
# k=4 branch layers are 1/6 of the stack.
RANDOM_SHAPE = dict(num_layers=24, hidden_size=896, intermediate_size=4864, num_heads=14, num_kv_heads=2,
                    head_dim=64, max_position=8192, initializer_range=0.02)


@dataclass(frozen=True)
class BenchConfig:
    model: str | Path
    adapter: str | Path
    memory_fraction: float = 0.1  # of what vLLM sizes KV from; (b) gives each of its engines half
    max_model_len: int = 2048
    block_size: int | None = None
    compile: bool = False
    cores: str = "0-1"  # the cores every setup uses (vLLM's VLLM_CPU_OMP_THREADS_BIND syntax: "0-1")
    two_engine_cores: str = "split"  # "split": (b)'s engines get half the cores each; "shared": both all
    questions: int = 24  # single-turn turns per concurrency level
    concurrency: tuple[int, ...] = (1, 4)
    threads: int = 2  # 5-turn threads
    thread_turns: int = 5
    answer_tokens: int = 64
    prefix_repeats: int = 3
    workloads: tuple[str, ...] = ("single", "multi", "prefix", "memory")


def _cores(spec: str) -> list[int]:
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def _bind(cores: Sequence[int]) -> str:
    return ",".join(str(c) for c in cores)


def _engine_config(config: BenchConfig, adapter, memory_fraction: float) -> EngineConfig:
    return EngineConfig(model=config.model, adapter=adapter, memory_fraction=memory_fraction,
                        max_model_len=config.max_model_len, block_size=config.block_size,
                        enforce_eager=not config.compile)


def _start(cores: Sequence[int], start):
    """Start an engine whose processes are bound to `cores` (vLLM reads the binding when it spawns them)."""
    previous = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = _bind(cores)
    try:
        return start()
    finally:
        if previous is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = previous


class DedicatedGate:
    """The dedicated gate engine: stock vLLM's pooling runner on the exported gate classifier."""

    def __init__(self, export_dir: Path, config: BenchConfig, memory_fraction: float) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        meta = json.loads((export_dir / "gatehead_dedicated.json").read_text())
        self.order = [list(meta["labels"]).index(label) for label in LABELS]
        args = dict(model=str(export_dir), runner="pooling", dtype="bfloat16", max_model_len=config.max_model_len,
                    gpu_memory_utilization=memory_fraction, enforce_eager=not config.compile, seed=0)
        if config.block_size:
            args["block_size"] = config.block_size
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    async def probs(self, prompt_ids: Sequence[int]) -> dict[str, float]:
        from vllm import PoolingParams

        final = await _last(self.llm.encode({"prompt_token_ids": list(prompt_ids)}, PoolingParams(task="classify"),
                                            request_id=f"dgate-{uuid.uuid4().hex}"))
        row = final.outputs.data.tolist()
        return {label: float(row[i]) for label, i in zip(LABELS, self.order, strict=True)}

    @property
    def kv_tokens(self) -> int:
        cache = self.llm.vllm_config.cache_config
        return int(cache.num_gpu_blocks) * int(cache.block_size)

    def engine_pids(self) -> list[int]:
        return [p.pid for p in self.llm.engine_core.resources.engine_manager.processes]

    def shutdown(self) -> None:
        self.llm.shutdown()
        del self.llm


class TwoEngines:
    """Setup (b) behind the engine interface the agent uses: stock vLLM generates, the dedicated engine gates."""

    def __init__(self, generator: SharedEngine, gate: DedicatedGate, adapter) -> None:
        self.generator, self.dedicated, self.adapter = generator, gate, adapter
        self.tokenizer = generator.tokenizer
        self.prompts = PromptBuilder(self.tokenizer, adapter.spec.suffix,
                                     PromptConfig(max_context=generator.max_model_len))

    async def gate(self, question, passages=(), conversation=(), thresholds=None, cache_salt=None) -> GateOutcome:
        prompt = self.prompts.build(question, passages, conversation)
        probs = await self.dedicated.probs(prompt.gate)
        return GateOutcome(gate_result(probs, thresholds or self.adapter.spec.thresholds), prompt, len(prompt.gate), 0)

    def stream(self, prompt, **kwargs):
        return self.generator.stream(prompt, **kwargs)

    async def generate(self, prompt, **kwargs):
        return await self.generator.generate(prompt, **kwargs)


class Ungated:
    """Setup (c): the shared engine answering every turn without a gate (the prompt is laid out as usual)."""

    def __init__(self, engine: SharedEngine) -> None:
        self.engine, self.adapter, self.tokenizer, self.prompts = engine, engine.adapter, engine.tokenizer, \
            engine.prompts

    async def gate(self, question, passages=(), conversation=(), thresholds=None, cache_salt=None) -> GateOutcome:
        prompt = self.prompts.build(question, passages, conversation)
        probs = {"answer": 1.0, "refuse": 0.0, "search": 0.0}
        return GateOutcome(gate_result(probs, ALWAYS_ANSWER), prompt, len(prompt.gate), 0)

    def stream(self, prompt, **kwargs):
        return self.engine.stream(prompt, **kwargs)

    async def generate(self, prompt, **kwargs):
        return await self.engine.generate(prompt, **kwargs)


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
    ttft = None
    for t in result.timings:
        by_node[t["node"]] = by_node.get(t["node"], 0.0) + t["seconds"]
        if t["node"] == "generate":
            ttft = t.get("ttft")
    if result.decision != "answer" or ttft is None:
        raise RuntimeError(f"a benchmark turn did not answer: decision {result.decision!r}, error {result.error!r}")
    return {"seconds": seconds, "gate": by_node.get("gate", 0.0), "ttft": ttft,
            "retrieve": by_node.get("retrieve", 0.0), "generate": by_node.get("generate", 0.0),
            "decision": result.gates[-1]["decision"] if result.gates else ""}


def _summary(turns: Sequence[dict], wall: float) -> dict:
    seconds = [t["seconds"] for t in turns]
    return {"turns": len(turns), "wall_s": wall, "turns_per_s": len(turns) / wall,
            "e2e_p50_ms": 1000 * _percentile(seconds, 0.5), "e2e_p95_ms": 1000 * _percentile(seconds, 0.95),
            "gate_mean_ms": 1000 * statistics.mean(t["gate"] for t in turns),
            "ttft_mean_ms": 1000 * statistics.mean(t["ttft"] for t in turns),
            "retrieve_mean_ms": 1000 * statistics.mean(t["retrieve"] for t in turns)}


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


def prefix_prompts(engine: SharedEngine, lengths: Sequence[int], corpus: Sequence[str]):
    """Per length: a question over passages cut from `corpus` so the gate prompt has about that many tokens."""
    assert engine.prompts is not None
    out = []
    for length in lengths:
        passages, words, i = [], [], 0
        prompt = engine.prompts.build("What does the last passage say about the warranty?", [])
        while len(prompt.gate) < length and i < 10_000:
            words.append(corpus[i % len(corpus)])
            i += 1
            if len(words) == 40:
                passages.append(Passage(" ".join(words)))
                words = []
                prompt = engine.prompts.build("What does the last passage say about the warranty?", passages)
        if prompt.dropped.passages or len(prompt.answer) + 1 > engine.max_model_len:
            continue
        out.append((length, prompt))
    return out


async def prefix_reuse(engine: SharedEngine, prompts, repeats: int) -> list[dict]:
    """Answer time to first token cold vs right after a gate on the same prefix (prefix cache emptied each time)."""

    rows = []
    for length, prompt in prompts:
        cold, warm, gate_ms, cached = [], [], [], 0
        for _ in range(repeats):
            await engine.reset_prefix_cache()
            cold.append((await ttft(engine, prompt.answer))[0])
            await engine.reset_prefix_cache()
            started = time.perf_counter()
            await engine.gate_prompt(prompt.gate, ALWAYS_ANSWER)
            gate_ms.append(time.perf_counter() - started)
            seconds, cached = await ttft(engine, prompt.answer)
            warm.append(seconds)
        rows.append({"target_tokens": length, "answer_prompt_tokens": len(prompt.answer), "cached_tokens": cached,
                     "cold_ttft_ms": 1000 * statistics.median(cold),
                     "after_gate_ttft_ms": 1000 * statistics.median(warm),
                     "gate_ms": 1000 * statistics.median(gate_ms),
                     "ratio": statistics.median(warm) / statistics.median(cold)})
    return rows


def _rss(pids: Sequence[int]) -> int:
    import psutil

    total = 0
    for pid in pids:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
    return total


# ----- the run -------------------------------------------------------------------------------------


def _questions(n: int, offset: int = 0) -> list[str]:
    from gatehead.demo.build import held_out_examples

    answerable = [e.question for e in held_out_examples() if e.label == "answer"]
    # One question per product first (the held-out set asks each fact twice, worded differently).
    seen, firsts = set(), []
    for q in answerable:
        key = q.rsplit(" the ", 1)[-1]
        if key not in seen:
            seen.add(key)
            firsts.append(q)
    pool = firsts + [q for q in answerable if q not in firsts]
    return pool[offset:offset + n]


async def _workloads(agent, engine_for_prefix: SharedEngine | None, config: BenchConfig, corpus: Sequence[str],
                     reset) -> dict:
    """The workloads on one setup; `reset()` empties its engines' prefix caches before each one, so no
    workload reads what an earlier one left (within a workload, turns share prefixes as real traffic does)."""
    out: dict = {}
    warmup = _questions(2, offset=200)
    await single_turn(agent, warmup, 2, config.answer_tokens)  # first-request costs out of the figures
    if "single" in config.workloads:
        questions = _questions(config.questions)
        for c in config.concurrency:
            await reset()
            out[f"single_c{c}"] = await single_turn(agent, questions, c, config.answer_tokens)
    if "multi" in config.workloads:
        pool = _questions(config.threads * config.thread_turns, offset=config.questions)
        threads = [pool[i * config.thread_turns:(i + 1) * config.thread_turns] for i in range(config.threads)]
        await reset()
        out["multi_turn"] = await multi_turn(agent, threads, config.answer_tokens)
    if "prefix" in config.workloads and engine_for_prefix is not None:
        lengths = [n for n in PREFIX_LENGTHS if n < config.max_model_len]
        out["prefix_reuse"] = await prefix_reuse(engine_for_prefix, prefix_prompts(engine_for_prefix, lengths, corpus),
                                                 config.prefix_repeats)
    return out


def run(config: BenchConfig, log=print) -> dict:
    """All three setups, one after the other on this machine; returns the figures (see the module docstring)."""
    from gatehead.agent.graph import Agent, AgentConfig
    from gatehead.demo.index import open_demo_store
    from gatehead.evals.kv import checkpoint_bytes
    from gatehead.runtime.dedicated import export_dedicated

    cores = _cores(config.cores)
    if config.two_engine_cores == "split":
        if len(cores) < 2:
            raise ValueError("--two-engine-cores split needs at least 2 cores in --cores")
        half = len(cores) // 2
        gen_cores, gate_cores = cores[:half], cores[half:]
    elif config.two_engine_cores == "shared":
        gen_cores = gate_cores = cores
    else:
        raise ValueError(f"two_engine_cores must be 'split' or 'shared', not {config.two_engine_cores!r}")
    agent_config = AgentConfig(thresholds=ALWAYS_ANSWER, max_answer_tokens=config.answer_tokens)
    figures: dict = {"setups": {}}
    with tempfile.TemporaryDirectory(prefix="gatehead-bench-") as tmp:
        store = open_demo_store(Path(tmp) / "qdrant", log=lambda *_: None)
        try:
            corpus = " ".join(h.text for h in store.search("warranty price weight colour", top_k=20)).split()
            log("(a) shared engine + (c) the same engine without a gate")
            engine = _start(cores, lambda: SharedEngine(_engine_config(config, config.adapter, config.memory_fraction)))
            async def shared_phase() -> dict:  # one event loop for the engine's whole life
                figures["setups"]["a_shared"] = await _workloads(Agent(engine, store, agent_config), engine, config,
                                                                 corpus, engine.reset_prefix_cache)
                figures["setups"]["c_ungated"] = await _workloads(Agent(Ungated(engine), store, agent_config), None,
                                                                  config, corpus, engine.reset_prefix_cache)
                return {"kv_tokens": engine.kv_tokens, "rss_bytes": _rss(engine.engine_pids()),
                        "plugin_bytes": await engine.plugin_memory()}

            try:
                memory = {"shared": asyncio.run(shared_phase())}
            finally:
                engine.shutdown()
            log("(b) stock vLLM + the dedicated gate engine")
            export = export_dedicated(config.model, config.adapter, Path(tmp) / "dedicated")
            half = config.memory_fraction / 2
            generator = _start(gen_cores, lambda: SharedEngine(_engine_config(config, None, half)))
            dedicated = None
            try:
                dedicated = _start(gate_cores, lambda: DedicatedGate(export, config, half))
                two = TwoEngines(generator, dedicated, engine.adapter)

                async def reset_both() -> None:
                    await generator.reset_prefix_cache()
                    await dedicated.llm.reset_prefix_cache()

                figures["setups"]["b_two_engines"] = asyncio.run(
                    _workloads(Agent(two, store, agent_config), None, config, corpus, reset_both))
                memory["two_engines"] = {"generator_kv_tokens": generator.kv_tokens,
                                         "gate_kv_tokens": dedicated.kv_tokens,
                                         "rss_bytes": _rss(generator.engine_pids() + dedicated.engine_pids())}
            finally:
                generator.shutdown()
                if dedicated is not None:
                    dedicated.shutdown()
            if "memory" in config.workloads:
                log("stock vLLM at the shared engine's memory fraction (KV capacity)")
                stock = _start(cores, lambda: SharedEngine(_engine_config(config, None, config.memory_fraction)))
                try:
                    memory["stock"] = {"kv_tokens": stock.kv_tokens, "rss_bytes": _rss(stock.engine_pids())}
                finally:
                    stock.shutdown()
                base = checkpoint_bytes(config.model)
                lora_and_head = memory["shared"]["plugin_bytes"].get("lora_and_head", 0)
                memory["weights_bytes"] = {"one_engine": base + lora_and_head,
                                           "two_engines": base + checkpoint_bytes(export)}
                memory["kv_ratio_shared_vs_stock"] = memory["shared"]["kv_tokens"] / memory["stock"]["kv_tokens"]
            figures["memory"] = memory
        finally:
            store.close()
    figures["ratios"] = ratios(figures["setups"])
    return figures


def ratios(setups: dict) -> dict:
    """(a)/(b) throughput and (a)/(c) end-to-end latency, per workload."""
    a, b, c = setups["a_shared"], setups["b_two_engines"], setups["c_ungated"]
    out = {}
    for key in a:
        if key.startswith("single_"):
            out[key] = {"throughput_a_over_b": a[key]["turns_per_s"] / b[key]["turns_per_s"],
                        "throughput_a_over_c": a[key]["turns_per_s"] / c[key]["turns_per_s"],
                        "e2e_p50_a_over_c": a[key]["e2e_p50_ms"] / c[key]["e2e_p50_ms"],
                        "e2e_p50_a_over_b": a[key]["e2e_p50_ms"] / b[key]["e2e_p50_ms"]}
    if "multi_turn" in a:
        out["multi_turn_e2e_p50_a_over_c"] = [x["e2e_p50_ms"] / y["e2e_p50_ms"] for x, y in
                                              zip(a["multi_turn"]["by_turn"], c["multi_turn"]["by_turn"], strict=True)]
        out["multi_turn_e2e_p50_a_over_b"] = [x["e2e_p50_ms"] / y["e2e_p50_ms"] for x, y in
                                              zip(a["multi_turn"]["by_turn"], b["multi_turn"]["by_turn"], strict=True)]
    return out


def random_model(directory: Path) -> tuple[Path, Path]:
    """The 0.36 B random Qwen3 and its random gate adapter under `directory` (built once, reused)."""
    from gatehead.runtime.tiny import TinySpec, build_tiny

    model, adapter = directory / "model", directory / "adapter"
    if not (adapter / "gate.json").exists():
        build_tiny(directory, TinySpec(**RANDOM_SHAPE))
    return model, adapter


def tables(figures: dict) -> str:
    """The figures as Markdown tables."""
    from gatehead.evals.run import table

    names = {"a_shared": "(a) shared", "b_two_engines": "(b) two engines", "c_ungated": "(c) no gate"}
    setups = figures["setups"]
    parts = []
    for key in [k for k in setups["a_shared"] if k.startswith("single_")]:
        rows = [[names[s], f["turns_per_s"], f["gate_mean_ms"], f["ttft_mean_ms"], f["e2e_p50_ms"], f["e2e_p95_ms"]]
                for s, f in ((s, setups[s][key]) for s in names)]
        turns = setups["a_shared"][key]["turns"]
        header = ["setup", "turns/s", "gate ms", "answer TTFT ms", "e2e p50 ms", "e2e p95 ms"]
        parts.append(f"Single-turn, concurrency {key.removeprefix('single_c')} ({turns} turns)\n\n"
                     + table(header, rows))
    if "multi_turn" in setups["a_shared"]:
        rows = []
        for i in range(len(setups["a_shared"]["multi_turn"]["by_turn"])):
            rows.append([i + 1] + [setups[s]["multi_turn"]["by_turn"][i][m] for s in names
                                   for m in ("e2e_p50_ms", "gate_mean_ms")])
        parts.append("Multi-turn threads (e2e p50 / gate mean, ms, per turn of the thread)\n\n"
                     + table(["turn"] + [f"{names[s]} {m}" for s in names for m in ("e2e", "gate")], rows))
    if "prefix_reuse" in setups["a_shared"]:
        parts.append("Prefix reuse on the shared engine (medians)\n\n" + table(
            ["answer prompt tokens", "cached after gate", "cold TTFT ms", "after-gate TTFT ms", "gate ms", "ratio"],
            [[r["answer_prompt_tokens"], r["cached_tokens"], r["cold_ttft_ms"], r["after_gate_ttft_ms"], r["gate_ms"],
              r["ratio"]] for r in setups["a_shared"]["prefix_reuse"]]))
    memory, mib = figures.get("memory", {}), 1 << 20
    if "weights_bytes" in memory:
        parts.append("Memory\n\n" + table(["", "one shared engine", "two engines", "stock alone"], [
            ["weights MiB", memory["weights_bytes"]["one_engine"] / mib, memory["weights_bytes"]["two_engines"] / mib,
             ""],
            ["engine processes RSS MiB", memory["shared"]["rss_bytes"] / mib, memory["two_engines"]["rss_bytes"] / mib,
             memory["stock"]["rss_bytes"] / mib],
            ["KV tokens", memory["shared"]["kv_tokens"],
             f"{memory['two_engines']['generator_kv_tokens']} + {memory['two_engines']['gate_kv_tokens']}",
             memory["stock"]["kv_tokens"]]]) + f"\nKV shared / stock: {memory['kv_ratio_shared_vs_stock']:.4f}")
    parts.append("Ratios\n\n```\n" + json.dumps(figures["ratios"], indent=1) + "\n```")
    return "\n\n".join(parts) + "\n"


def main(args) -> int:
    """`gatehead bench` (arguments parsed by the CLI)."""
    from gatehead.demo import ADAPTER_DIR, MODEL_DIR

    if args.model == "demo":
        model, adapter, max_len = MODEL_DIR, ADAPTER_DIR, args.max_model_len or 2048
    elif args.model == "random":
        model, adapter = random_model(Path(args.random_dir))
        max_len = args.max_model_len or 4608
    else:
        model, adapter, max_len = Path(args.model), Path(args.adapter), args.max_model_len or 2048
    config = BenchConfig(model=model, adapter=adapter, memory_fraction=args.memory_fraction, max_model_len=max_len,
                         block_size=args.block_size, compile=args.compile, cores=args.cores,
                         two_engine_cores=args.two_engine_cores, questions=args.questions,
                         concurrency=tuple(args.concurrency), threads=args.threads, answer_tokens=args.answer_tokens,
                         prefix_repeats=args.prefix_repeats, workloads=tuple(args.workloads))
    started = time.time()
    figures = run(config)
    result = {"machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                          "python": platform.python_version()},
              "model": args.model,
              "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
              "seconds": round(time.time() - started, 1), **figures}
    text = tables(figures)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        Path(args.out).with_suffix(".md").write_text(text)
    return 0

