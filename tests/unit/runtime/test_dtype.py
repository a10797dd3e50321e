"""dtype auto on each kind of CPU: bf16 only where the hardware computes it; an explicit bf16 elsewhere warns."""

from __future__ import annotations

import logging

import pytest
import torch

from gatehead.runtime import dtype
from gatehead.runtime.engine import EngineConfig

# What torch's ISA checks answer on each kind (the ones vLLM reads to load its kernels).
KINDS = {
    "amx": {"_is_amx_tile_supported": True, "_is_avx512_bf16_supported": True, "_is_avx512_supported": True},
    "avx512_bf16": {"_is_amx_tile_supported": False, "_is_avx512_bf16_supported": True, "_is_avx512_supported": True},
    "avx512": {"_is_amx_tile_supported": False, "_is_avx512_bf16_supported": False, "_is_avx512_supported": True},
    "avx2": {"_is_amx_tile_supported": False, "_is_avx512_bf16_supported": False, "_is_avx512_supported": False},
}


@pytest.fixture
def cpu(monkeypatch):
    """`cpu(kind)`: this process's torch answers as an x86 CPU of that kind, without CUDA."""
    def become(kind: str) -> None:
        monkeypatch.setattr(dtype.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        for name, answer in KINDS[kind].items():
            monkeypatch.setattr(torch.cpu, name, lambda answer=answer: answer)

    return become


@pytest.mark.parametrize(("kind", "auto", "path"), [("amx", "bfloat16", "AMX"),
                                                    ("avx512_bf16", "bfloat16", "AVX-512 BF16"),
                                                    ("avx512", "float32", "emulated"), ("avx2", "float32", "emulated")])
def test_auto_is_bf16_only_where_the_cpu_computes_it(cpu, kind: str, auto: str, path: str) -> None:
    cpu(kind)
    assert dtype.cpu_kind() == kind and dtype.cpu_bf16_path() == path
    assert dtype.resolve_dtype("auto") == auto and EngineConfig(model="m").dtype == auto
    assert dtype.dtype_reason(auto).startswith(auto) and dtype.KIND_NAMES[kind] in dtype.dtype_reason(auto)
    assert dtype.resolve_dtype("float32") == "float32"


def test_cuda_runs_bf16(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert dtype.resolve_dtype("auto") == "bfloat16" and dtype.dtype_reason("bfloat16") == "bfloat16 (CUDA)"


def test_an_explicit_bf16_runs_where_it_is_emulated_and_warns(cpu, caplog) -> None:
    cpu("avx2")
    dtype._warn_emulated.cache_clear()  # once per process: this test must see it
    with caplog.at_level(logging.WARNING, logger="gatehead.runtime.dtype"):
        assert EngineConfig(model="m", dtype="bfloat16").dtype == "bfloat16"
    assert "emulated" in caplog.text and "dtype=auto runs fp32" in caplog.text
    caplog.clear()
    cpu("avx512_bf16")
    with caplog.at_level(logging.WARNING, logger="gatehead.runtime.dtype"):
        assert EngineConfig(model="m", dtype="bfloat16").dtype == "bfloat16"
    assert caplog.text == ""


def test_an_unknown_dtype_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, bfloat16, float32, float16"):
        EngineConfig(model="m", dtype="bf16")


def test_an_explicit_kv_size_bounds_the_default_window_to_what_fits(caplog) -> None:
    """SmolLM2-135M's shape: 8,192 positions take 360 MiB of KV in fp32 and 180 MiB in bf16; a 256 MiB pool
    holds one request of 5,825 tokens in fp32, so the window defaults to 5,632 (whole 256-token steps)."""
    from types import SimpleNamespace

    from gatehead.runtime.plan import default_window, kv_bytes_per_token

    shape = SimpleNamespace(max_position_embeddings=8192, num_hidden_layers=30, num_attention_heads=9,
                            num_key_value_heads=3, head_dim=64, hidden_size=576)
    assert kv_bytes_per_token(shape, "float32") == 2 * 30 * 3 * 64 * 4 == 2 * kv_bytes_per_token(shape, "bfloat16")
    with caplog.at_level(logging.INFO, logger="gatehead"):
        assert default_window(shape, EngineConfig(model="m", dtype="float32", kv_cache_memory_bytes=256 << 20)) == 5632
    assert "context window 5632 tokens: the model's 8192 do not fit the 256 MiB KV cache in float32" in caplog.text
    assert default_window(shape, EngineConfig(model="m", dtype="bfloat16", kv_cache_memory_bytes=256 << 20)) == 8192
    assert default_window(shape, EngineConfig(model="m", dtype="float32")) == 8192  # sized by memory fraction
    assert default_window(shape, EngineConfig(model="m", dtype="float32", kv_cache_memory_bytes=1 << 20)) == 256
