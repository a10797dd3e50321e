"""The suite's CPU-kind emulation (tests/cpu_isa): what an emulated kind's processes are given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CPU_ISA = Path(__file__).resolve().parents[2] / "cpu_isa"

# A process started as the suite starts one (the folder's sitecustomize on PYTHONPATH), which starts a child
# the same way, as vLLM's engine processes are: both report the cache torch.compile's kernels come from.
PROBE = """
import json, os, subprocess, sys
from torch._inductor.runtime.cache_dir_utils import cache_dir
child = subprocess.run([sys.executable, "-c", "from torch._inductor.runtime.cache_dir_utils import cache_dir; "
                        "print(cache_dir())"], capture_output=True, text=True, check=True).stdout.strip()
print(json.dumps({"parent": cache_dir(), "child": child, "aten": os.environ.get("ATEN_CPU_CAPABILITY")}))
"""


def probe(kind: str, cache: str | None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                        "MKL_ENABLE_INSTRUCTIONS")}
    env.update(GATEHEAD_TEST_CPU_ISA=kind, PYTHONPATH=os.pathsep.join([str(CPU_ISA), env.get("PYTHONPATH", "")]))
    if cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_emulated_kind_compiles_into_an_inductor_cache_of_its_own(tmp_path) -> None:
    """Under the AVX2 emulation, vLLM's TP=2 embedding read a kernel the host's native runs had cached and
    looked up rows out of range (stock engines too); each emulated kind keeps its own cache, in every
    process, appended once to the one set, and a native run keeps inductor's."""
    native = probe("native", None)
    assert native["parent"] == native["child"] and native["aten"] is None
    avx2 = probe("avx2", None)
    assert avx2 == {"parent": native["parent"] + "-avx2", "child": native["parent"] + "-avx2", "aten": "avx2"}
    set_here = probe("avx2", str(tmp_path / "cache"))
    assert set_here["parent"] == set_here["child"] == str(tmp_path / "cache") + "-avx2"
