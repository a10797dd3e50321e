"""Makes this Python process compute as another kind of x86 CPU would (GATEHEAD_TEST_CPU_ISA=avx512 | avx2).

The suite must pass on every kind of host CI may get: AMX, AVX-512 BF16, AVX-512F only (`avx512`)
and AVX2 only (`avx2`, AMD EPYC and Ryzen before Zen 4). On a host of a richer kind this picks the
poorer kind's code paths, in each library that chooses by the CPU:
- torch's ISA checks answer as that CPU would (`torch.cpu._is_amx_tile_supported`,
  `_is_avx512_bf16_supported`, and for avx2 `_is_avx512_supported`, `_is_vnni_supported`): vLLM reads
  them to choose its kernel library (`_C`, `_C_AVX512`, `_C_AVX2`), its attention ISA ("amx" or
  "vec"), whether FP8 KV is possible, and gatehead reads them to pick its dtype (runtime/dtype.py);
- torch's own vectorised kernels run at that capability (`ATEN_CPU_CAPABILITY`: avx512 | avx2);
- oneDNN, torch's and vLLM's, is capped at that ISA (`ONEDNN_MAX_CPU_ISA`: AVX512_CORE | AVX2), so
  a bf16 primitive is refused or emulated where that CPU would refuse or emulate it;
- MKL's GEMMs take that ISA's code path (`MKL_ENABLE_INSTRUCTIONS`: AVX512 | AVX2), so fp32 sums are
  blocked as on that CPU;
- torch.compile's kernels come from an inductor cache of that kind alone (`TORCHINDUCTOR_CACHE_DIR`, the
  default or the one set, with `-avx512` | `-avx2` appended), not the host's native runs' cache: on an
  AVX-512 BF16 host that had run natively, both TP=2 engines (stock and gatehead's) looked up rows out
  of range in vLLM's tensor-parallel embedding under the AVX2 emulation with the shared cache (its
  `get_masked_input_and_mask` is torch.compile'd), and pass with a cache of the emulated kind's own.
The variables must be set before the libraries first run: `tests/conftest.py` calls `apply()` before it
imports torch and puts this folder on PYTHONPATH, so its `sitecustomize` applies it at the start of
every Python process the tests start (vLLM's engine cores and workers included). It does not emulate
the other CPU's timings, and C++ code that probes CPUID itself beyond these (torch's bf16 checks for
its own oneDNN matmuls) still sees the host: which is why bf16 rules are judged only where bf16 is
native, and emulated kinds run fp32.
"""

from __future__ import annotations

import getpass
import os
import tempfile

VARIABLE = "GATEHEAD_TEST_CPU_ISA"
CHOICES = ("native", "avx512", "avx2")
INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"  # torch.compile's kernels: one cache per emulated kind

# The environment of each emulated kind: torch's kernels, oneDNN, MKL.
ENVIRONMENT = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}
# torch.cpu's checks that answer False on each emulated kind.
ABSENT = {
    "avx512": ("_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_avx512_bf16_supported"),
    "avx2": ("_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_avx512_bf16_supported",
             "_is_avx512_supported", "_is_vnni_supported"),
}


def requested() -> str:
    """The ISA the tests were asked to emulate ("native" when the variable is unset)."""
    choice = os.environ.get(VARIABLE, "native") or "native"
    if choice not in CHOICES:
        raise ValueError(f"{VARIABLE}={choice!r}: use one of {', '.join(CHOICES)} (or leave it unset)")
    return choice


def apply_environment() -> None:
    """Set the emulated kind's variables; call before torch is imported."""
    kind = requested()
    for name, value in ENVIRONMENT.get(kind, {}).items():
        os.environ[name] = value
    if kind != "native":
        os.environ[INDUCTOR_CACHE] = inductor_cache(kind, os.environ.get(INDUCTOR_CACHE))


def inductor_cache(kind: str, current: str | None) -> str:
    """The inductor cache directory of an emulated `kind`: `current` (else inductor's default,
    <tmp>/torchinductor_<user>) with `-<kind>` appended, once (a child process inherits it set)."""
    base = current or os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return base if base.endswith(f"-{kind}") else f"{base}-{kind}"


def apply() -> None:
    """Emulate the requested ISA in this process; call before oneDNN, MKL or vLLM first runs."""
    kind = requested()
    if kind == "native":
        return
    apply_environment()
    import torch

    for name in ABSENT[kind]:
        setattr(torch.cpu, name, _no)


def _no() -> bool:
    return False
