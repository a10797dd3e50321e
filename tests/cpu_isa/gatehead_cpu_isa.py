"""Makes this Python process compute as a CPU without AMX or AVX-512 BF16 would (GATEHEAD_TEST_CPU_ISA=avx512).

The suite must pass on both kinds of host these machines come in: with AMX and AVX-512 BF16, and with
AVX-512F only, where bf16 is emulated. On an AMX host this picks the other kind's code paths:
oneDNN is capped at AVX-512 without bf16 (`ONEDNN_MAX_CPU_ISA`, read when oneDNN first runs), and
torch's own ISA checks, which vLLM reads to choose its kernels (its `_C_AVX512` library instead of
`_C`, the "vec" attention instead of "amx", oneDNN GEMMs instead of AMX ones), answer as that CPU
would. It does not emulate the other CPU's instruction timings, and kernels that probe the CPU
themselves in C++ may still see AMX. `tests/conftest.py` applies it to the test process and puts
this folder on PYTHONPATH, so its `sitecustomize` applies it to every process the tests start.
"""

from __future__ import annotations

import os

VARIABLE = "GATEHEAD_TEST_CPU_ISA"
CHOICES = ("native", "avx512")


def requested() -> str:
    """The ISA the tests were asked to emulate ("native" when the variable is unset)."""
    choice = os.environ.get(VARIABLE, "native") or "native"
    if choice not in CHOICES:
        raise ValueError(f"{VARIABLE}={choice!r}: use one of {', '.join(CHOICES)} (or leave it unset)")
    return choice


def apply() -> None:
    """Emulate the requested ISA in this process; call before oneDNN or vLLM first runs."""
    if requested() != "avx512":
        return
    os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX512_CORE"
    import torch

    for name in ("_is_amx_tile_supported", "_is_amx_fp16_supported", "_is_avx512_bf16_supported"):
        setattr(torch.cpu, name, _no)


def _no() -> bool:
    return False
