"""The engines `gatehead bench`'s setups run on: each layout is started, measured, read for memory, shut down.

A layout is one or two engines with their cores and KV memory, and the setups (`gatehead.benchmarks.peers`)
measured on them one after the other: `OneEngine` (one engine on every core with the whole KV memory: the
shared engine with a prompt-mode or a suffix-mode gate, or stock vLLM), `TwoEngineLayout` (stock vLLM
beside the dedicated gate engine, half the memory each, in one of two core bindings) and `RemoteLayout`
(the suffix-mode gate in a `vllm serve` process, reached over HTTP). The benchmark loop
(`side_by_side.run`) treats them alike. This module measures nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gatehead.runtime.engine import EngineConfig, SharedEngine

PREFIX_SETUPS = ("a_prompt", "a_suffix", "d_judge")  # the gates the prefix-reuse workload times
# Where the refused-turns workload runs: sequential vs beside the gate, first come or by priority.
REFUSAL_SETUPS = ("a_suffix", "a_overlap", "a_suffix_prio", "a_overlap_prio")


@dataclass(frozen=True)
class Measured:
    """One setup on a started layout: what the agent runs on, with which settings, and where the prefix-reuse
    workload answers (None: not run) and whether the refused-turns workload runs."""

    key: str  # a `bench_report.SETUP_NAMES` key
    peer: Any
    agent_config: Any
    prefix_engine: SharedEngine | None = None
    refusals: bool = False


def engine_config(bench, adapter, memory_fraction: float, policy: str = "fcfs") -> EngineConfig:
    """The engine every setup of `bench` (a `BenchConfig`) starts, with `adapter` (None: stock vLLM) and vLLM's
    scheduling `policy`."""
    return EngineConfig(model=bench.model, adapter=adapter, memory_fraction=memory_fraction,
                        max_model_len=bench.max_model_len, block_size=bench.block_size,
                        enforce_eager=not bench.compile, dtype=bench.dtype, scheduling_policy=policy)


def bound(cores: Sequence[int], start: Callable[[], Any]) -> Any:
    """`start()` an engine whose processes are bound to `cores` (vLLM reads the binding when it spawns them)."""
    from gatehead.runtime.cpu_setup import bound_to

    with bound_to(",".join(str(c) for c in cores)):
        return start()


def resident_bytes(pids: Sequence[int]) -> int:
    """Resident memory of processes `pids` and their children."""
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


class OneEngine:
    """One engine on `cores` with the whole KV memory, scheduling by `policy`; `setups` maps a setup key to (the
    peer made from the engine, its agent settings)."""

    def __init__(self, name: str, bench, adapter: Path | None, cores: Sequence[int],
                 setups: dict[str, tuple[Callable[[SharedEngine], Any], Any]], policy: str = "fcfs") -> None:
        self.name, self.bench, self.adapter, self.cores, self.setups = name, bench, adapter, cores, setups
        self.policy = policy
        self.engine: SharedEngine | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """The setups measured on this layout, in order."""
        return tuple(self.setups)

    def start(self) -> None:
        self.engine = bound(self.cores, lambda: SharedEngine(engine_config(self.bench, self.adapter,
                                                                           self.bench.memory_fraction, self.policy)))

    def measured(self) -> Iterator[Measured]:
        for key, (make, settings) in self.setups.items():
            yield Measured(key, make(self.engine), settings, self.engine if key in PREFIX_SETUPS else None,
                           refusals=key in REFUSAL_SETUPS)

    async def reset(self) -> None:
        await self.engine.reset_prefix_cache()

    async def memory(self) -> dict:
        return {"kv_tokens": self.engine.kv_tokens, "rss_bytes": resident_bytes(self.engine.engine_pids()),
                "plugin_bytes": await self.engine.plugin_memory()}

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()


class TwoEngineLayout:
    """(b): stock vLLM generating on `gen_cores` beside the dedicated gate engine (the export of the prompt-mode
    adapter, made once into `export`) on `gate_cores`, half the KV memory each."""

    name = "two_engines"

    def __init__(self, key: str, bench, adapter, export: Path, gen_cores: Sequence[int], gate_cores: Sequence[int],
                 agent_config) -> None:
        self.key, self.bench, self.adapter, self.export = key, bench, adapter, export
        self.gen_cores, self.gate_cores, self.agent_config = gen_cores, gate_cores, agent_config
        self.generator: SharedEngine | None = None
        self.dedicated = None

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.key,)

    def start(self) -> None:
        from gatehead.benchmarks.peers import DedicatedGate
        from gatehead.runtime.dedicated import export_dedicated

        if not (self.export / "gatehead_dedicated.json").exists():
            export_dedicated(self.bench.model, self.bench.adapter, self.export, dtype=self.bench.dtype)
        half = self.bench.memory_fraction / 2
        self.generator = bound(self.gen_cores, lambda: SharedEngine(engine_config(self.bench, None, half)))
        self.dedicated = bound(self.gate_cores, lambda: DedicatedGate(
            self.export, self.bench.max_model_len, half, not self.bench.compile, self.bench.block_size,
            self.bench.dtype))

    def measured(self) -> Iterator[Measured]:
        from gatehead.benchmarks.peers import TwoEngines

        yield Measured(self.key, TwoEngines(self.generator, self.dedicated, self.adapter), self.agent_config)

    async def reset(self) -> None:
        await self.generator.reset_prefix_cache()
        await self.dedicated.llm.reset_prefix_cache()

    async def memory(self) -> dict:
        from gatehead.evals.kv import checkpoint_bytes

        return {"generator_kv_tokens": self.generator.kv_tokens, "gate_kv_tokens": self.dedicated.kv_tokens,
                "gate_prefix_caching": self.dedicated.prefix_caching,
                "rss_bytes": resident_bytes(self.generator.engine_pids() + self.dedicated.engine_pids()),
                "dedicated_weights_bytes": checkpoint_bytes(self.export, self.bench.dtype)}

    def shutdown(self) -> None:
        if self.generator is not None:
            self.generator.shutdown()
        if self.dedicated is not None:
            self.dedicated.shutdown()


class RemoteLayout:
    """(a'-remote): the suffix-mode gate inside vLLM's own OpenAI server (`vllm serve` with `gatehead vllm-args`'
    flags: one server process on `cores` with the whole KV memory, as (a')'s engine), the agent on `RemoteEngine`
    over loopback HTTP. The server runs in vLLM's development mode only so that `reset` can empty its prefix cache
    between workloads (`/reset_prefix_cache`)."""

    name = "remote_suffix"
    keys = ("a_remote",)

    def __init__(self, bench, cores: Sequence[int], agent_config, log_dir: Path) -> None:
        self.bench, self.cores, self.agent_config, self.log_dir = bench, cores, agent_config, log_dir
        self.server: Any = None
        self.engine: Any = None
        self.url = ""

    def start(self) -> None:
        import socket

        from gatehead.runtime.remote import RemoteConfig, RemoteEngine
        from gatehead.runtime.vllm_serve import ServerProcess, serve_command

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = serve_command(engine_config(self.bench, self.bench.suffix_adapter, self.bench.memory_fraction),
                                host="127.0.0.1", port=port)
        self.server = ServerProcess(command, self.url, self.log_dir / "vllm-serve.log",
                                    {"VLLM_SERVER_DEV_MODE": "1",
                                     "VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in self.cores)})
        self.server.wait_ready(900)
        self.engine = RemoteEngine(RemoteConfig(urls=(self.url,), model=self.bench.model,
                                                adapter=self.bench.suffix_adapter))

    def measured(self) -> Iterator[Measured]:
        from gatehead.benchmarks.peers import SharedGate

        yield Measured("a_remote", SharedGate(self.engine), self.agent_config)

    async def reset(self) -> None:
        reply = await self.engine.client.post(f"{self.url}/reset_prefix_cache")
        reply.raise_for_status()

    async def memory(self) -> dict:
        return {"rss_bytes": resident_bytes([self.server.process.pid])}

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
        if self.server is not None:
            self.server.stop(60)
