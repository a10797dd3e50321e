"""`gatehead serve`: the HTTP service, configured by the flags and variables of `settings.SERVE`."""

from __future__ import annotations

import argparse
import os

from gatehead.cli.common import agent_store, agent_thresholds, base_model_name, chosen_model, model_locations, vllm_urls
from gatehead.cli.settings import SERVE, add_settings, apply_environment
from gatehead.runtime.canary import CanaryConfig
from gatehead.runtime.guard import GuardConfig


def engine_args(args: argparse.Namespace) -> dict:
    """`--tensor-parallel-size` and every `--engine-arg NAME=VALUE` as vLLM engine arguments."""
    import json

    if args.tensor_parallel_size < 1:
        raise SystemExit(f"--tensor-parallel-size must be >= 1, got {args.tensor_parallel_size}")
    out: dict = {"tensor_parallel_size": args.tensor_parallel_size} if args.tensor_parallel_size != 1 else {}
    for item in args.engine_arg or ():
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise SystemExit(f"--engine-arg takes NAME=VALUE with NAME a vLLM engine argument, got {item!r}")
        try:
            out[name] = json.loads(value)
        except json.JSONDecodeError:
            out[name] = value
    return out


def _serve(args: argparse.Namespace) -> int:
    import logging

    from gatehead.agent import AgentConfig
    from gatehead.runtime.engine import EngineConfig
    from gatehead.server.config import ServerConfig
    from gatehead.server.serve import serve

    args = apply_environment(args, SERVE)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    keys = list(args.api_key or []) + [k for k in os.environ.get("GATEHEAD_API_KEYS", "").split(",") if k.strip()]
    locations = model_locations()
    model = chosen_model(args.model)
    store, corpus = agent_store(args)
    engine = EngineConfig(model=model, adapter=args.adapter or locations["adapter"], enforce_eager=not args.compile,
                          kv_cache_memory_bytes=args.kv_mb << 20, max_model_len=args.max_model_len,
                          block_size=args.block_size, max_num_batched_tokens=args.max_batched_tokens, dtype=args.dtype,
                          extra=engine_args(args))
    config = ServerConfig(
        engine=engine, vllm_urls=vllm_urls(args), vllm_api_key=os.environ.get("VLLM_API_KEY"),
        base_model_name=base_model_name(model), store=store, corpus=corpus, threads=args.threads,
        api_keys=tuple(k.strip() for k in keys), cors_origins=tuple(args.cors_origin or ()),
        max_body_bytes=args.max_body, max_inflight=args.max_inflight, request_timeout=args.timeout,
        drain_seconds=args.drain_seconds,
        agent=AgentConfig(top_k=args.top_k, max_searches=args.max_searches, max_answer_tokens=args.max_tokens,
                          answer_beside_gate=args.answer_beside_gate, thresholds=agent_thresholds(args)),
        guard=GuardConfig(window=args.guard_window, improbable_logprob=args.guard_improbable_logprob,
                          improbable_run=args.guard_improbable_run, enabled=not args.no_guard),
        canary=CanaryConfig(interval=args.canary_interval, unready_after=args.canary_unready_after,
                            enabled=not args.no_canaries))
    serve(config, args.host, args.port)
    return 0


def add_parsers(commands) -> None:
    p = commands.add_parser("serve", help="the HTTP service: agent chat, gate, OpenAI-compatible API, probes, "
                                          "metrics; every option also from GATEHEAD_<OPTION>")
    add_settings(p, SERVE)
    p.set_defaults(func=_serve)
