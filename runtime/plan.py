"""What an engine will be, worked out before anything starts: `EngineConfig` (how to start it) and `EnginePlan`
(the tokenizer, the context window, the gate adapter checked against the base with its ids and prompt layout,
and vLLM's engine arguments). `SharedEngine` starts vLLM's `AsyncLLM` on a plan; `gatehead vllm-args` writes
the same arguments as `vllm serve` flags (`gatehead.runtime.vllm_serve`); `RemoteEngine` lays prompts out
with one. Nothing here starts a process.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gatehead.gate.adapter import GateAdapter, load_gate_adapter
from gatehead.gate.prompt import PromptBuilder, PromptConfig, reserved_token_id
from gatehead.runtime import checks
from gatehead.runtime.dtype import resolve_dtype
from gatehead.runtime.frontend import admission_hook
from gatehead.runtime.plugin import GATED_ARCHITECTURES
from gatehead.runtime.wiring import Wiring


@dataclass(frozen=True)
class EngineConfig:
    """How to start the engine. `adapter=None` gives stock vLLM (generation only)."""

    model: str | Path
    adapter: str | Path | None = None
    # "auto": bf16 where the hardware computes it, fp32 where it would be emulated (runtime/dtype.py);
    # resolved when the config is made, so `config.dtype` names what runs.
    dtype: Literal["auto", "bfloat16", "float32", "float16"] = "auto"
    max_model_len: int | None = None  # default: the model's
    kv_cache_memory_bytes: int | None = None  # explicit KV size; else memory_fraction sizes it
    memory_fraction: float = 0.5
    enforce_eager: bool = False  # False: vLLM's compile mode (the default mode of vLLM)
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    block_size: int | None = None
    max_gate_tokens: int | None = None  # default: max_model_len
    seed: int = 0
    # "priority": vLLM's priority scheduler, where a request's `priority` (lower first) orders the waiting
    # queue and picks who is preempted; "fcfs" (vLLM's default) ignores it.
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    # Diagnostics that separate causes in the stability check: "perturbed" is its negative control
    # (the tap writes its rounding back); "off" loads the gated model without the tap, and
    # branch=False keeps the tap but never runs the branch. Gate requests fail in both.
    # "suffix-only" is the negative control of suffix-mode gates: the branch ignores the cached prefix.
    tap: Literal["copy", "perturbed", "off"] = "copy"
    branch: bool | Literal["suffix-only"] = True
    extra: dict[str, Any] = field(default_factory=dict)  # more vLLM engine arguments

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        if self.tap not in ("copy", "perturbed", "off"):
            raise ValueError(f"EngineConfig.tap must be 'copy', 'perturbed' or 'off', got {self.tap!r}")
        if self.branch not in (True, False, "suffix-only"):
            raise ValueError(f"EngineConfig.branch must be True, False or 'suffix-only', got {self.branch!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("EngineConfig.scheduling_policy must be 'fcfs' or 'priority', "
                             f"got {self.scheduling_policy!r}")


def kv_bytes_per_token(hf_config, dtype: str) -> int:
    """KV-cache bytes one token takes in every layer (keys and values) of a Llama/Qwen-style model."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * heads * head_dim * (4 if dtype == "float32" else 2)


def default_window(hf_config, config: EngineConfig) -> int:
    """The context window when none is given: the model's, or, where an explicit KV size cannot hold one
    request of that length (vLLM refuses to start then), the longest that fits, in whole 256-token steps."""
    window = int(hf_config.max_position_embeddings)
    if config.kv_cache_memory_bytes is None:
        return window
    fits = config.kv_cache_memory_bytes // kv_bytes_per_token(hf_config, config.dtype) // 256 * 256
    if fits < window:
        logging.getLogger("gatehead").info(
            "context window %d tokens: the model's %d do not fit the %d MiB KV cache in %s (give max_model_len "
            "or more KV memory to change it)", fits, window, config.kv_cache_memory_bytes >> 20, config.dtype)
    return max(min(window, fits), 256)


@dataclass
class EnginePlan:
    """What an engine on `EngineConfig` will be, worked out and checked before anything starts: the tokenizer,
    the context window, the gate adapter (checked against the base) with its ids and prompt layout, and
    vLLM's engine arguments. `SharedEngine` starts `AsyncLLM` on it; `gatehead vllm-args` turns its
    arguments into `vllm serve` flags (`gatehead.runtime.vllm_serve`)."""

    config: EngineConfig
    tokenizer: Any
    max_model_len: int
    adapter: GateAdapter | None = None
    suffix_ids: tuple[int, ...] = ()
    action_ids: tuple[int, ...] = ()
    max_gate_tokens: int = 0
    prompts: PromptBuilder | None = None
    wiring: Wiring | None = None
    args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, config: EngineConfig) -> EnginePlan:
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")  # the plugin hooks the V1 runner
        from transformers import AutoConfig, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(Path(config.model))
        hf_config = AutoConfig.from_pretrained(Path(config.model))
        plan = cls(config, tokenizer, config.max_model_len or default_window(hf_config, config))
        if config.adapter is not None:
            plan._wire_gate(hf_config)
        plan.args = plan._engine_args()
        return plan

    def _wire_gate(self, hf_config: Any) -> None:
        """Load and check the gate adapter (once: the workers trust it), set the gate's ids and prompt layout,
        and give the wiring the workers read (`gatehead.runtime.wiring`)."""
        config = self.config
        self.adapter = load_gate_adapter(config.adapter, Path(config.model))
        arch = self.adapter.spec.base.architecture
        checks.unsupported_args(config.extra)
        if self.adapter.suffix_mode:
            checks.kv_readable_args(config.dtype, config.extra, config.block_size, hf_config)
        if arch not in GATED_ARCHITECTURES:
            raise ValueError(f"gatehead's shared engine supports {sorted(GATED_ARCHITECTURES)}, not {arch}")
        self.suffix_ids = tuple(self.tokenizer.encode(self.adapter.spec.suffix, add_special_tokens=False))
        self.action_ids = tuple(reserved_token_id(self.tokenizer, t) for t in self.adapter.spec.action_tokens)
        # A suffix-mode gate keeps no prompt rows: its gate prompts may fill the context.
        self.max_gate_tokens = min(config.max_gate_tokens or self.max_model_len, self.max_model_len)
        # Budgeted so that the gate prompt fits max_gate_tokens and the answer fits the window.
        answer_tokens = PromptConfig(max_context=self.max_model_len).answer_tokens
        window = min(self.max_model_len, self.max_gate_tokens + answer_tokens)
        self.prompts = PromptBuilder(self.tokenizer, self.adapter.spec.suffix, PromptConfig(max_context=window))
        self.wiring = Wiring(adapter=str(Path(config.adapter).resolve()), suffix_ids=self.suffix_ids,
                             action_ids=self.action_ids, max_gate_tokens=self.max_gate_tokens, tap=config.tap,
                             branch=config.branch)

    def _engine_args(self) -> dict[str, Any]:
        """vLLM's engine arguments: the config's, and with a gate its architecture, wiring and hooks."""
        config = self.config
        args = dict(
            model=str(Path(config.model)), dtype=config.dtype, max_model_len=self.max_model_len, seed=config.seed,
            enforce_eager=config.enforce_eager, enable_prefix_caching=config.enable_prefix_caching,
            enable_chunked_prefill=config.enable_chunked_prefill, scheduling_policy=config.scheduling_policy,
            disable_log_stats=False, **config.extra,
        )
        if self.wiring is not None:
            args["hf_overrides"] = self.wiring.overrides(GATED_ARCHITECTURES[self.adapter.spec.base.architecture])
            args["worker_extension_cls"] = "gatehead.runtime.plugin.WorkerExtension"
            args["logits_processors"] = [admission_hook(self.adapter.suffix_mode)]
        if config.kv_cache_memory_bytes is not None:
            args["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
        else:
            args["gpu_memory_utilization"] = config.memory_fraction
        for name in ("max_num_batched_tokens", "max_num_seqs", "block_size"):
            if getattr(config, name) is not None:
                args[name] = getattr(config, name)
        return args
