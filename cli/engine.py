"""The engine's own commands: `gate`, `generate`, `export-dedicated`, `vllm-args` and `serve-vllm` (the gate in a
stock `vllm serve`), and `build-tiny` (a tiny random model, `gatehead.tiny`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gatehead.cli.common import add_model_arguments, chosen_model, model_locations, start_engine, thresholds


def _gate(args: argparse.Namespace) -> int:
    import asyncio

    from gatehead.gate.prompt import Passage

    passages = [Passage(text=d) for d in args.doc]
    chosen = thresholds(args)
    if args.engine == "hf":
        from gatehead.gate.reference import HFReference

        locations = model_locations()
        dtype = "float32" if args.dtype == "auto" else args.dtype  # the reference's default: the fp32 ground truth
        reference = HFReference(chosen_model(args.model), args.adapter or locations["adapter"], dtype)
        result = reference.gate(args.question, passages, thresholds=chosen)
    else:
        engine = start_engine(args)
        try:
            result = asyncio.run(engine.gate(args.question, passages, thresholds=chosen)).result
        finally:
            engine.shutdown()
    print(json.dumps({"decision": result.decision, "probs": result.probs,
                      "thresholds": result.thresholds.to_dict()}, indent=2))
    return 0


def _generate(args: argparse.Namespace) -> int:
    import asyncio

    engine = start_engine(args, gate=not args.no_gate)
    try:
        if args.raw:
            prompts = list(args.prompt)
        else:  # a user turn in the model's own chat template, special-token parsing off for the text
            from gatehead.gate.prompt import encode_untrusted

            prompts = []
            for text in args.prompt:
                chat = [{"role": "user", "content": "\x00"}]
                markup = engine.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                head, tail = markup.split("\x00")
                encode = engine.tokenizer.encode
                prompts.append(encode(head, add_special_tokens=False) + encode_untrusted(engine.tokenizer, text)
                               + encode(tail, add_special_tokens=False))
        outputs = asyncio.run(engine.generate_many(prompts, max_tokens=args.max_tokens, temperature=args.temperature))
    finally:
        engine.shutdown()
    for output in outputs:
        print(json.dumps({"text": output.text, "tokens": len(output.token_ids), "finish_reason": output.finish_reason})
              if args.json else output.text)
    return 0


def _export_dedicated(args: argparse.Namespace) -> int:
    from gatehead.runtime.dedicated import export_dedicated

    locations = model_locations()
    from gatehead.runtime.dtype import resolve_dtype

    out = export_dedicated(chosen_model(args.model), args.adapter or locations["adapter"], args.out,
                           dtype=resolve_dtype(args.dtype))
    print(f"wrote {out}: serve it with stock vLLM, LLM(model=..., runner='pooling').classify(...)")
    return 0


def _serve_command(args: argparse.Namespace):
    from gatehead.runtime.engine import EngineConfig
    from gatehead.runtime.vllm_serve import serve_command

    locations = model_locations()
    kv = {"kv_cache_memory_bytes": args.kv_mb << 20} if args.kv_mb else {"memory_fraction": args.memory_fraction}
    config = EngineConfig(model=chosen_model(args.model), adapter=args.adapter or locations["adapter"],
                          dtype=args.dtype, max_model_len=args.max_model_len, enforce_eager=not args.compile,
                          block_size=args.block_size, max_gate_tokens=args.max_gate_tokens, **kv)
    vllm_flags = list(args.vllm_flags or [])
    if vllm_flags[:1] == ["--"]:
        vllm_flags = vllm_flags[1:]
    return serve_command(config, host=args.host, port=args.port, served_name=args.served_model_name,
                         vllm_flags=vllm_flags)


def _vllm_args(args: argparse.Namespace) -> int:
    command = _serve_command(args)
    print(command.shell())
    return 0


def _serve_vllm(args: argparse.Namespace) -> int:
    import os
    import sys

    command = _serve_command(args)
    argv, environment = command.module_argv(sys.executable), command.process_environment()
    added = " ".join(f"{k}={environment[k]}" for k in ("LD_PRELOAD", "VLLM_CPU_OMP_THREADS_BIND")
                     if environment.get(k) and environment.get(k) != os.environ.get(k))
    print(f"gatehead serve-vllm: {command.shell()}" + (f" (this machine's CPU set-up: {added})" if added else ""),
          file=sys.stderr, flush=True)
    os.execvpe(argv[0], argv, environment)


def _build_tiny(args: argparse.Namespace) -> int:
    from gatehead.tiny import TinySpec, build_tiny

    tiny = build_tiny(args.out, TinySpec(arch=args.arch, num_layers=args.layers, seed=args.seed))
    print(f"model:   {tiny.model_dir}\nadapter: {tiny.adapter_dir}")
    return 0


def add_parsers(commands) -> None:
    p = commands.add_parser("gate", help="gate one question over documents (shared vLLM engine, or the HF reference)")
    p.add_argument("--question", required=True)
    p.add_argument("--doc", action="append", default=[], help="a document's text (repeatable)")
    add_model_arguments(p)
    p.add_argument("--engine", choices=["vllm", "hf"], default="vllm",
                   help="vllm: gatehead's shared engine (default); hf: the transformers reference (in fp32 "
                        "unless --dtype bfloat16)")
    p.add_argument("--t-answer", type=float, help="answer threshold (default: the adapter's)")
    p.add_argument("--t-refuse", type=float, help="refuse threshold (default: the adapter's)")
    p.set_defaults(func=_gate)

    p = commands.add_parser("generate", help="generate completions on the shared engine")
    p.add_argument("prompt", nargs="+", help="prompts, sent together (each a user turn unless --raw)")
    add_model_arguments(p)
    p.add_argument("--no-gate", action="store_true", help="start stock vLLM on the base model (no adapter)")
    p.add_argument("--raw", action="store_true", help="send each prompt as is (chat markup in it is parsed)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--json", action="store_true", help="one JSON object per completion")
    p.set_defaults(func=_generate)

    p = commands.add_parser("export-dedicated", help="merge the gate into an HF classifier for stock vLLM")
    p.add_argument("out", type=Path)
    p.add_argument("--model", help="base model directory (default: GATEHEAD_MODEL, else the demo model)")
    p.add_argument("--adapter", help="gate adapter directory (default: GATEHEAD_ADAPTER, else the demo's)")
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float32"], default="auto",
                   help="the checkpoint's dtype: auto is the one this host's engines run (bf16 where native, "
                   "else fp32)")
    p.set_defaults(func=_export_dedicated)

    for name, func, about in (
            ("vllm-args", _vllm_args, "print the `vllm serve` command that serves generation and this gate from "
                                      "stock vLLM's OpenAI server (checked as the in-process engine checks it)"),
            ("serve-vllm", _serve_vllm, "start vLLM's own OpenAI server with those flags (this process becomes it)")):
        p = commands.add_parser(name, help=about)
        add_model_arguments(p)
        p.add_argument("--memory-fraction", type=float, default=0.9,
                       help="the accelerator memory vLLM may take, where --kv-mb is 0 (GPUs)")
        p.add_argument("--block-size", type=int, help="KV block size (default: vLLM's)")
        p.add_argument("--max-gate-tokens", type=int, help="the longest gate prompt (default: the context window)")
        p.add_argument("--host", help="the server's address (default: vLLM's)")
        p.add_argument("--port", type=int, help="the server's port (default: vLLM's, 8000)")
        p.add_argument("--served-model-name", help="the model id the server reports (default: the model folder's "
                       "name and the adapter's fingerprint, which `--vllm-url` clients check)")
        p.add_argument("vllm_flags", nargs=argparse.REMAINDER,
                       help="after --: more `vllm serve` flags, passed through (e.g. -- --tensor-parallel-size 2)")
        p.set_defaults(func=func)

    p = commands.add_parser("build-tiny", help="build a tiny random model and gate adapter (tests, benchmarks)")
    p.add_argument("out", type=Path)
    p.add_argument("--arch", default="qwen3", help="qwen3, qwen2 or llama")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_build_tiny)

