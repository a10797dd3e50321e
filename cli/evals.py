"""Measuring: `eval` (judged by evals/RULES.md), `bench` (the gate beside its peers) and `figures`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gatehead.benchmarks.bench_report import SETUP_NAMES, WORKLOADS
from gatehead.cli.common import add_model_arguments, chosen_model, model_locations, store_config


def _eval_arguments(p: argparse.ArgumentParser, memory_fraction: float | None = None) -> None:
    add_model_arguments(p)
    p.add_argument("--memory-fraction", type=float, default=memory_fraction,
                   help="size the KV cache by this memory fraction instead of --kv-mb")
    p.add_argument("--block-size", type=int, help="KV block size (a multiple of 32 on CPU)")
    p.add_argument("--out", type=Path, help="output folder (default: eval-runs/<eval>-<time>)")
    p.add_argument("--ledger", type=Path, help="the ledger to append to (default: eval-runs/ledger.jsonl)")


def _figures(args: argparse.Namespace) -> int:
    from gatehead.figures import FiguresConfig, main

    return main(FiguresConfig(only=tuple(args.only or ()), list_only=args.list, readme=args.readme,
                              reread=args.reread, allow_dirty=args.dirty, dir=args.dir, logs=args.logs))


def _bench(args: argparse.Namespace) -> int:
    from gatehead.benchmarks.side_by_side import (
        SPLIT_NEEDS_TWO,
        BenchConfig,
        bench,
        bench_models,
        default_setups,
    )
    from gatehead.runtime.cpu_setup import cores_of

    if (args.model in ("demo", "random")) == bool(args.adapter):
        raise ValueError("--adapter goes with --model PATH, and only with it")
    if args.suffix_adapter and args.model in ("demo", "random"):
        raise ValueError("--suffix-adapter goes with --model PATH (demo and random bring their own)")
    for name in ("questions", "threads", "answer_tokens", "prefix_repeats", "runs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if any(c < 1 for c in args.concurrency):
        raise ValueError("--concurrency values must be >= 1")
    if not 0.0 < args.memory_fraction < 1.0:
        raise ValueError("--memory-fraction must be in (0, 1)")
    if "split" in args.two_engine_cores and len(cores_of(args.cores)) < 2:
        raise ValueError(SPLIT_NEEDS_TWO)
    model, adapter, suffix, window = bench_models(args.model, args.random_dir, args.adapter, args.suffix_adapter,
                                                  args.max_model_len)
    config = BenchConfig(
        model=model, adapter=adapter, suffix_adapter=suffix, memory_fraction=args.memory_fraction,
        max_model_len=window, block_size=args.block_size, compile=args.compile, cores=args.cores,
        two_engine_cores=tuple(args.two_engine_cores), questions=args.questions, concurrency=tuple(args.concurrency),
        threads=args.threads, answer_tokens=args.answer_tokens, prefix_repeats=args.prefix_repeats, runs=args.runs,
        setups=tuple(args.setups) if args.setups else default_setups(suffix, args.two_engine_cores),
        workloads=tuple(args.workloads), dtype=args.dtype, target_set="demo" if args.model == "demo" else "random")
    return bench(config, args.model, args.out)


def _eval(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from gatehead.evals.run import run_eval
    from gatehead.runtime.engine import EngineConfig

    if args.eval == "convert-squad":
        from gatehead.evals.squad import convert_squad

        corpus, questions = convert_squad(args.squad, args.out, args.fixed_documents, args.limit)
        print(f"wrote {corpus} and {questions}")
        return 0
    locations = model_locations()
    config = EngineConfig(model=chosen_model(args.model), adapter=args.adapter or locations["adapter"],
                          enforce_eager=not args.compile, max_model_len=args.max_model_len,
                          kv_cache_memory_bytes=None if args.memory_fraction else args.kv_mb << 20,
                          memory_fraction=args.memory_fraction or EngineConfig.memory_fraction,
                          block_size=args.block_size, dtype=args.dtype)
    settings = {k: str(v) for k, v in asdict(config).items() if k != "extra"}
    settings.update({k: v for k, v in vars(args).items() if k not in ("func", "command") and not callable(v)
                     and k not in settings})
    if args.eval == "stability":
        from gatehead.evals.stability import run_stability

        variants = [v.strip() for v in args.variants.split(",") if v.strip()]
        return run_eval("stability", settings, lambda out: run_stability(config, args.n, args.max_tokens, variants,
                                                                         out), args.out, args.ledger)
    if args.eval == "agreement":
        from gatehead.evals.agreement import run_agreement

        return run_eval("agreement", settings, lambda out: run_agreement(config, args.m, out), args.out, args.ledger)
    if args.eval == "kv":
        from gatehead.evals.kv import run_kv

        return run_eval("kv", settings, lambda out: run_kv(config, out), args.out, args.ledger)
    if args.eval == "threads":
        from gatehead.evals.threads import run_threads

        store = store_config(args) if (args.store or args.url) else None
        return run_eval("threads", settings, lambda out: run_threads(config, out, args.threads, store,
                                                                     args.concurrency, args.min_right),
                        args.out, args.ledger)
    from gatehead import demo
    from gatehead.evals.dataset import run_dataset

    questions, corpus = args.questions, args.corpus
    if args.demo:
        questions = questions or demo.DEMO_DIR / "data" / f"{args.demo}.jsonl"
        corpus = corpus or demo.DEMO_DIR / "corpus"
    if questions is None:
        raise ValueError("give --questions (or --demo for a demo split)")
    store = store_config(args) if (args.store or args.url) else None
    return run_eval("dataset", settings, lambda out: run_dataset(
        config, questions, corpus, out, store, args.gate_only, args.top_k, args.limit, args.concurrency,
        min_accuracy=args.min_accuracy), args.out, args.ledger)


def add_parsers(commands) -> None:
    _add_eval(commands)
    _add_bench(commands)
    _add_figures(commands)


def _add_eval(commands) -> None:
    p = commands.add_parser("eval", help="evals judged by evals/RULES.md: stability, agreement, kv, dataset, threads")
    evals = p.add_subparsers(dest="eval", required=True, metavar="EVAL")
    e = evals.add_parser("stability", help="answer stability of the shared engine vs stock vLLM")
    e.add_argument("-n", type=int, default=64, help="generation requests (default 64)")
    e.add_argument("--max-tokens", type=int, default=128)
    e.add_argument("--variants", default="plain,mixed,tap-only,no-tap", help="comma-separated variants")
    _eval_arguments(e)
    e = evals.add_parser("agreement", help="gate agreement: shared vs dedicated engine and the HF references")
    e.add_argument("-m", type=int, default=256, help="gate requests (default 256)")
    _eval_arguments(e)
    e = evals.add_parser("kv", help="KV capacity stock vs shared at one memory fraction; plugin and weights memory")
    _eval_arguments(e, memory_fraction=0.1)
    e = evals.add_parser("dataset", help="offline run over a labelled question set (gate or whole agent)")
    e.add_argument("--questions", type=Path, help="questions JSONL (see evals/dataset.py)")
    e.add_argument("--corpus", type=Path, help="a folder or JSONL file of documents, ingested into a fresh store")
    e.add_argument("--demo", nargs="?", const="val", choices=["val", "test"],
                   help="a demo split with its corpus: val (the default) or test (read once per committed model, "
                   "recorded in evals/demo-ledger.jsonl)")
    where = e.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="DIR", help="an existing embedded store instead of ingesting")
    where.add_argument("--url", help="an existing Qdrant server instead (API key from QDRANT_API_KEY)")
    e.add_argument("--collection", help="collection in --store or --url")
    e.add_argument("--gate-only", action="store_true", help="run the gate alone, not the agent")
    e.add_argument("--top-k", type=int, default=3)
    e.add_argument("--limit", type=int, help="the first N questions only")
    e.add_argument("--concurrency", type=int, default=8, help="questions in flight")
    e.add_argument("--min-accuracy", type=float, help="fail below this gate accuracy")
    _eval_arguments(e)
    e = evals.add_parser("threads", help="hand-written threads through the whole agent (a test set: read once)")
    e.add_argument("--threads", type=Path, help="threads JSONL (default: demo/threads-handwritten.jsonl)")
    where = e.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="DIR", help="an existing embedded store (default: the demo index, "
                       "built in the run's folder)")
    where.add_argument("--url", help="an existing Qdrant server instead (API key from QDRANT_API_KEY)")
    e.add_argument("--collection", help="collection in --store or --url")
    e.add_argument("--concurrency", type=int, default=4, help="threads in flight")
    e.add_argument("--min-right", type=float, help="fail below this rate of right values on answerable turns")
    _eval_arguments(e)
    e = evals.add_parser("convert-squad", help="SQuAD 2.0-style JSON -> corpus.jsonl + questions.jsonl")
    e.add_argument("squad", type=Path)
    e.add_argument("out", type=Path)
    e.add_argument("--fixed-documents", action="store_true", help="each question keeps its own context")
    e.add_argument("--limit", type=int)
    p.set_defaults(func=_eval)


def _add_bench(commands) -> None:
    p = commands.add_parser("bench", help="side-by-side benchmarks: the shared engine's gates against their peers",
                            description="Runs benchmarks/side_by_side.py (its docstring says what is measured).")
    p.add_argument("--model", default="demo", help="demo | random (a 0.36 B random Qwen3, built on first use) "
                   "| a model folder (with --adapter)")
    p.add_argument("--adapter", help="the prompt-mode gate adapter of --model PATH")
    p.add_argument("--suffix-adapter", help="a suffix-mode gate adapter of --model PATH (setup (a'))")
    p.add_argument("--random-dir", default=".cache/bench-random", help="where --model random is built and kept")
    p.add_argument("--setups", nargs="+", choices=list(SETUP_NAMES),
                   help="default: all (a' and a'-overlap where a suffix-mode adapter is known)")
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--runs", type=int, default=3, help="runs of every workload per setup (medians, min, max)")
    p.add_argument("--questions", type=int, default=32, help="single-turn turns per concurrency level")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--threads", type=int, default=3, help="5-turn threads in the multi-turn workload")
    p.add_argument("--answer-tokens", type=int, default=64, help="answer budget per turn")
    p.add_argument("--prefix-repeats", type=int, default=1, help="per run and prefix length")
    p.add_argument("--memory-fraction", type=float, default=0.1,
                   help="KV memory of the shared engine; (b) gives each of its two engines half")
    p.add_argument("--max-model-len", type=int, help="default: 2048 (demo), 8704 (random)")
    p.add_argument("--block-size", type=int)
    p.add_argument("--compile", action="store_true", help="vLLM compile mode instead of eager")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                   help="every setup's dtype; auto: bf16 where the CPU computes it, else fp32")
    p.add_argument("--cores", default=f"0-{(os.cpu_count() or 1) - 1}", help="cores every setup uses (default all)")
    p.add_argument("--two-engine-cores", nargs="+", choices=["split", "shared"], default=["split", "shared"],
                   help="(b)'s bindings, each a setup: half the cores each (split), all cores for both (shared)")
    p.add_argument("--out", type=Path, help="write the figures as JSON here (and the tables beside it, .md)")
    p.set_defaults(func=_bench)


def _add_figures(commands) -> None:
    p = commands.add_parser("figures", help="re-measure the figures the README and docs/figures.md show, each "
                            "into docs/figures/<item>.json",
                            description="Runs gatehead.figures' items (its docstring says what each file holds).")
    p.add_argument("--only", nargs="+", metavar="ITEM", help="these items only (--list names them)")
    p.add_argument("--list", action="store_true", help="list the items, their commands and expected minutes")
    p.add_argument("--reread", action="store_true", help="read sealed held-out data again on the same model")
    p.add_argument("--dirty", action="store_true", help="measure a tree with uncommitted changes (recorded: the "
                   "envelope and every page block that renders it say so, and the suite's page check fails)")
    p.add_argument("--readme", action="store_true", help="re-render the figure blocks of the README, "
                   "docs/figures.md and docs/demo-model.md from their files")
    p.add_argument("--dir", type=Path, default=Path("docs/figures"), help="where results go (default docs/figures)")
    p.add_argument("--logs", type=Path, help="keep each item's log here (default: beside its temporary output)")
    p.set_defaults(func=_figures)

