"""Stock and dedicated engines run no gatehead code: vLLM's plugin loading is restricted for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatehead.runtime.dedicated import export_dedicated
from gatehead.runtime.plugin import PLUGIN_NAME, other_vllm_plugins, stock_vllm
from gatehead.tiny import TinyModel

PROBE = Path(__file__).with_name("plugin_probe.py")


def test_stock_vllm_names_every_plugin_but_gatehead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    others = other_vllm_plugins()
    assert PLUGIN_NAME not in others
    with stock_vllm():
        assert os.environ["VLLM_PLUGINS"].split(",") == others or (not others and os.environ["VLLM_PLUGINS"] == "")
    assert "VLLM_PLUGINS" not in os.environ
    # A user's own restriction narrows the list further and comes back afterwards.
    monkeypatch.setenv("VLLM_PLUGINS", f"{PLUGIN_NAME},not-installed")
    with stock_vllm():
        assert os.environ["VLLM_PLUGINS"] == ""
    assert os.environ["VLLM_PLUGINS"] == f"{PLUGIN_NAME},not-installed"


def test_stock_and_dedicated_engine_processes_load_no_gatehead_code(tiny: TinyModel, tmp_path: Path) -> None:
    """In vLLM's default layout (engine core in its own process), as `gatehead serve` and the benchmark run.

    The shared engine's process is the control: the same probe finds gatehead's plugin there.
    """
    export = export_dedicated(tiny.model_dir, tiny.adapter_dir, tmp_path / "dedicated")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
    env.pop("VLLM_PLUGINS", None)
    done = subprocess.run([sys.executable, str(PROBE), str(tiny.model_dir), str(tiny.adapter_dir), str(export)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for stock in ("stock", "dedicated"):
        assert found[stock] == {"gatehead_modules": [], "forward_wrapped": False}, (stock, found[stock])
    assert found["shared"]["forward_wrapped"] and "gatehead.runtime.plugin" in found["shared"]["gatehead_modules"]
