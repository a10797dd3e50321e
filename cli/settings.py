"""The declared settings of the commands that run the engine: one table, read as flags and from the environment.

A `Setting` is one option: its flag, type, default and help. `add_settings` puts a tuple of them on a
parser. `gatehead serve` takes every one of its settings from `GATEHEAD_<NAME>` too (containers
configure by environment): `apply_environment` reads the table, never argparse's internals. A flag
on the command line wins; lists are comma-separated; switches take 1/true/yes or 0/false/no; a value
that does not parse is an error naming the variable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gatehead.agent.state import AgentConfig
from gatehead.retrieval.config import StoreConfig
from gatehead.runtime.canary import CanaryConfig
from gatehead.runtime.guard import GuardConfig

PREFIX = "GATEHEAD_"  # `gatehead serve --max-inflight` is also GATEHEAD_MAX_INFLIGHT, and so on
TRUE, FALSE = ("1", "true", "yes"), ("0", "false", "no")


@dataclass(frozen=True)
class Setting:
    flag: str  # "--max-inflight"
    help: str
    type: Callable[[str], Any] | None = str  # None: a switch (store_true)
    default: Any = None
    many: bool = False  # repeatable flag; comma-separated in the environment
    metavar: str | None = None
    exclusive: str | None = None  # settings sharing this name exclude each other (and are given together)
    environment: bool = True  # False: not read from GATEHEAD_<NAME> (read elsewhere, or not at all)

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    @property
    def variable(self) -> str:
        return PREFIX + self.dest.upper()

    def parse(self, raw: str) -> Any:
        """The value of `raw` as the environment gives it; ValueError naming the variable if it does not parse."""
        if self.type is None:
            if raw.lower() not in TRUE + FALSE:
                raise ValueError(f"{self.variable}={raw!r}: use 1/true/yes or 0/false/no")
            return raw.lower() in TRUE
        try:
            return [self.type(v.strip()) for v in raw.split(",") if v.strip()] if self.many else self.type(raw)
        except ValueError:
            raise ValueError(f"{self.variable}={raw!r} is not a valid value for {self.flag}") from None


def add_settings(parser: argparse.ArgumentParser, settings: Sequence[Setting]) -> None:
    groups: dict[str, Any] = {}
    for s in settings:
        if s.exclusive is not None and s.exclusive not in groups:
            groups[s.exclusive] = parser.add_mutually_exclusive_group()
        target = parser if s.exclusive is None else groups[s.exclusive]
        if s.type is None:
            target.add_argument(s.flag, action="store_true", help=s.help)
        else:
            target.add_argument(s.flag, type=s.type if s.type is not str else None, default=s.default,
                                action="append" if s.many else "store", metavar=s.metavar, help=s.help)


def apply_environment(args: argparse.Namespace, settings: Sequence[Setting],
                      environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """`args` with every setting not given as a flag taken from its variable, where that is set."""
    given = {s.dest for s in settings if getattr(args, s.dest) != (False if s.type is None else s.default)}
    for s in settings:  # one of an exclusive group on the command line: none of the group's variables applies
        if s.exclusive is not None and s.dest in given:
            given |= {t.dest for t in settings if t.exclusive == s.exclusive}
    for s in settings:
        raw = environ.get(s.variable, "") if s.environment and s.dest not in given else ""
        if raw:
            setattr(args, s.dest, s.parse(raw))
    return args


# ----- the table --------------------------------------------------------------------------------


def dtype(value: str) -> str:
    """A dtype the commands run (their references and exports take bf16 and fp32 only)."""
    if value not in ("auto", "bfloat16", "float32"):
        raise ValueError(f"{value!r}: choose auto, bfloat16 or float32")
    return value


MODEL = (
    Setting("--model", "base model directory (default: GATEHEAD_MODEL, else the demo model)", environment=False),
    Setting("--adapter", "gate adapter directory (default: GATEHEAD_ADAPTER, else the demo's)", environment=False),
    Setting("--compile", "vLLM's compile mode (slower start) instead of eager", type=None),
    Setting("--kv-mb", "KV-cache memory in MiB (default: 256)", type=int, default=256),
    Setting("--max-model-len", "context window (default: the model's)", type=int),
    Setting("--dtype", "auto (bf16 where the CPU or GPU computes it, fp32 where bf16 would be emulated), "
            "bfloat16 or float32", type=dtype, default="auto", metavar="auto|bfloat16|float32"),
)

AGENT = (
    Setting("--vllm-url", "run on these `vllm serve` servers (started with `gatehead vllm-args` on the same --model "
            "and --adapter; their --api-key from VLLM_API_KEY) instead of an engine in this process: a turn's "
            "requests go to one server, chosen by its thread", metavar="URL[,URL...]"),
    Setting("--store", "embedded Qdrant storage (default: the demo index in .cache/qdrant, built on first use)",
            metavar="DIR", exclusive="store"),
    Setting("--url", "a Qdrant server instead (API key from QDRANT_API_KEY)", exclusive="store"),
    Setting("--collection", f"collection in --store or --url (default: {StoreConfig.collection})"),
    Setting("--threads", "where threads persist: a SQLite file or a postgres:// URL (default: threads.sqlite next "
            "to the store)", metavar="PATH|URL"),
    Setting("--top-k", "passages per retrieval", type=int, default=AgentConfig.top_k),
    Setting("--max-searches", "query rewrites per turn before giving up", type=int, default=AgentConfig.max_searches),
    Setting("--max-tokens", "answer length limit", type=int, default=AgentConfig.max_answer_tokens),
    Setting("--answer-beside-gate", "submit each answer beside its gate and hold it until the gate says answer "
            "(aborted otherwise)", type=None),
    Setting("--t-answer", "the gate's answer threshold for the agent (default: the adapter's calibrated one)",
            type=float),
    Setting("--t-refuse", "the gate's refuse threshold for the agent (default: the adapter's calibrated one)",
            type=float),
)

SERVE = (
    Setting("--host", "the address to listen on", default="127.0.0.1"),
    Setting("--port", "the port to listen on", type=int, default=8000),
    Setting("--api-key", "a key clients must send as a Bearer token (repeatable; also GATEHEAD_API_KEYS, "
            "comma-separated); none: open", many=True, environment=False),
    Setting("--cors-origin", "an origin allowed cross-origin requests (default: none)", many=True),
    Setting("--max-body", "request body limit in bytes (413 above)", type=int, default=1 << 20),
    Setting("--max-inflight", "requests in flight before shedding with 503", type=int, default=32),
    Setting("--timeout", "per-request deadline in seconds (504); default none", type=float),
    Setting("--drain-seconds", "on SIGTERM, time for in-flight requests", type=float, default=30.0),
    Setting("--block-size", "tokens per KV-cache block (default: vLLM's for the platform)", type=int),
    Setting("--max-batched-tokens", "tokens per engine step; longer prompts are prefilled in chunks (default: "
            "vLLM's)", type=int),
    Setting("--tensor-parallel-size", "GPUs the engine shards the model over", type=int, default=1),
    Setting("--engine-arg", "another vLLM engine argument, VALUE as JSON or a plain string (repeatable), e.g. "
            "distributed_executor_backend=ray for several nodes", many=True, metavar="NAME=VALUE"),
    Setting("--no-guard", "turn the degenerate-output guard off", type=None),
    Setting("--guard-window", f"tokens a stream holds back until the guard clears them (default "
            f"{GuardConfig.window})", type=int, default=GuardConfig.window),
    Setting("--guard-improbable-logprob", f"a sampled token below this logprob is improbable (default "
            f"{GuardConfig.improbable_logprob})", type=float, default=GuardConfig.improbable_logprob),
    Setting("--guard-improbable-run", f"improbable tokens in a row that trip the guard (default "
            f"{GuardConfig.improbable_run})", type=int, default=GuardConfig.improbable_run),
    Setting("--no-canaries", "do not record and re-run the known-answer canary requests that watch the engine",
            type=None),
    Setting("--canary-interval", f"seconds between canary checks (default {CanaryConfig.interval:g}; 0: only after "
            f"errors)", type=float, default=CanaryConfig.interval),
    Setting("--canary-unready-after", f"failed canary checks in a row that make /readyz answer 503 (default "
            f"{CanaryConfig.unready_after})", type=int, default=CanaryConfig.unready_after),
    *MODEL,
    *AGENT,
)

# Every variable `gatehead serve` reads: its settings', the keys (added to --api-key's) and the model's location.
SERVE_VARIABLES = frozenset({s.variable for s in SERVE if s.environment}
                            | {"GATEHEAD_API_KEYS", "GATEHEAD_MODEL", "GATEHEAD_ADAPTER"})
