"""The host's compute dtype: which kind of CPU this is, and `auto` = bf16 only where the hardware computes it.

x86 CPUs come in four kinds for gatehead: AMX, AVX-512 BF16, AVX-512F only, AVX2 only. vLLM's CPU
backend loads other kernels on each (`_C`, `_C_AVX512`, `_C_AVX2`), and without bf16 instructions it
computes bf16 through fp32: about 6x slower for a prefill, with rounding of its own. So `dtype="auto"`
resolves to bf16 where it is native (AMX, AVX-512 BF16, CUDA) and to fp32 where it would be emulated.
The kind is read from torch's own ISA checks, the ones vLLM reads to choose its kernels, so the tests'
CPU emulation (tests/cpu_isa) changes it the way a real host of that kind would. Not measured, so not
special-cased: ARM CPUs with bf16 instructions get fp32 (only x86 kinds are told apart), and every CUDA
device counts as computing bf16 (pre-Ampere GPUs do not). This module does not change what the CPU
computes: it only says what it is and picks a dtype.
"""

from __future__ import annotations

import functools
import logging
import platform
from typing import Literal

CpuKind = Literal["amx", "avx512_bf16", "avx512", "avx2", "other"]
Dtype = Literal["bfloat16", "float32", "float16"]
DTYPES = ("auto", "bfloat16", "float32", "float16")

# How `gatehead info`, figures and logs name each kind's bf16 path.
BF16_PATHS: dict[CpuKind, str] = {"amx": "AMX", "avx512_bf16": "AVX-512 BF16", "avx512": "emulated",
                                  "avx2": "emulated", "other": "emulated"}
KIND_NAMES: dict[CpuKind, str] = {"amx": "AMX", "avx512_bf16": "AVX-512 BF16", "avx512": "AVX-512F without BF16",
                                  "avx2": "AVX2 without AVX-512", "other": platform.machine() or "unknown"}

log = logging.getLogger(__name__)


def cpu_kind() -> CpuKind:
    """This CPU's kind, as torch (and through it vLLM) sees it."""
    import torch

    if platform.machine().lower() not in ("x86_64", "amd64", "i686", "x86"):
        return "other"
    if torch.cpu._is_amx_tile_supported():
        return "amx"
    if torch.cpu._is_avx512_bf16_supported():
        return "avx512_bf16"
    if torch.cpu._is_avx512_supported():
        return "avx512"
    return "avx2"


def cpu_bf16_path() -> str:
    """Which bf16 path this CPU takes: "AMX", "AVX-512 BF16" or "emulated" (bf16 computed through fp32)."""
    return BF16_PATHS[cpu_kind()]


def bf16_native(device: str = "cpu") -> bool:
    """Whether the device computes bf16 in hardware (CUDA, or a CPU with AMX or AVX-512 BF16)."""
    if device == "cuda":
        return True
    return cpu_kind() in ("amx", "avx512_bf16")


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(requested: str = "auto", device: str | None = None) -> Dtype:
    """The dtype to run: `auto` is bf16 where it is native, else fp32. An explicit bf16 on a host that would
    emulate it is honoured, with a warning. ValueError for a dtype gatehead does not run."""
    if requested not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {requested!r}")
    device = device or _device()
    native = bf16_native(device)
    if requested == "auto":
        return "bfloat16" if native else "float32"
    if requested == "bfloat16" and not native:
        _warn_emulated(cpu_kind())
    return requested  # type: ignore[return-value]


@functools.cache
def _warn_emulated(kind: CpuKind) -> None:
    """Once per process: configs are copied (dataclasses.replace) and resolved again."""
    log.warning("dtype=bfloat16 on a %s CPU, which has no bf16 instructions: bf16 is emulated through fp32 "
                "(about 6x slower) and the gate's bf16 fidelity bounds are not promised here; "
                "dtype=auto runs fp32", KIND_NAMES[kind])


def dtype_reason(dtype: str, device: str | None = None) -> str:
    """One line for logs and `gatehead info`: the dtype and why."""
    device = device or _device()
    if device == "cuda":
        return f"{dtype} (CUDA)"
    kind = cpu_kind()
    how = "computes bf16 natively" if bf16_native(device) else "would emulate bf16 through fp32"
    return f"{dtype} (CPU: {KIND_NAMES[kind]}, which {how})"
