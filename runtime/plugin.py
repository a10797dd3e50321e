"""The vLLM plugin: registers the gated architectures and tells the gated model, each step, its gate rows.

vLLM calls `register()` through the `vllm.general_plugins` entry point in every process it starts
(client, engine core, workers). It registers `Gated<Arch>` model classes, selected per engine with
`hf_overrides={"architectures": ["Gated..."], ...}` (see `gatehead.runtime.engine`), and wraps the
V1 model runner's `_model_forward`, the runner's documented override point, which runs once per real
step after the batch is final. The wrapper reads which scheduled requests are gate requests
(`SamplingParams.extra_args`) and where their tokens lie, and hands that to the model. For any model
without a gate it calls the original method and does nothing else.

Suffix-mode (activated) gate requests read the prefix cache, but never past their suffix: the
scheduler's prefix-cache lookup (`KVCacheManager.get_computed_blocks`) is wrapped so that their hit
ends at or before the first suffix position, and every suffix row is computed by the base forward,
where the tap sees it. Every other request's lookup is left as vLLM made it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

GATED_ARCHITECTURES = {
    "Qwen3ForCausalLM": "GatedQwen3ForCausalLM",
    "Qwen2ForCausalLM": "GatedQwen2ForCausalLM",
    "LlamaForCausalLM": "GatedLlamaForCausalLM",
}
GATE_FLAG = "gatehead"  # SamplingParams.extra_args[GATE_FLAG] == "gate" marks a gate request
SUFFIX_FLAG = "gatehead_suffix"  # extra_args[SUFFIX_FLAG] = L: a suffix-mode gate whose last L tokens are its suffix


def is_gate_request(params: Any) -> bool:
    """Whether a request's `SamplingParams` (or None) carry the gate flag."""
    extra = params.extra_args if params is not None else None
    return bool(extra) and extra.get(GATE_FLAG) == "gate"


def suffix_length(params: Any) -> int:
    """The suffix length of a suffix-mode gate request's `SamplingParams`; 0 for any other request."""
    if not is_gate_request(params):
        return 0
    length = params.extra_args.get(SUFFIX_FLAG, 0)
    return length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else 0


PLUGIN_NAME = "gatehead"  # this package's `vllm.general_plugins` entry point


def other_vllm_plugins() -> list[str]:
    """The plugins vLLM would load, gatehead's left out (`VLLM_PLUGINS` narrows them, as in vLLM).

    Every `vllm.*` entry point group counts: `VLLM_PLUGINS` filters all of them (platform plugins too).
    """
    from importlib.metadata import entry_points

    found = entry_points()
    names = [e.name for group in found.groups if group.startswith("vllm.") for e in found.select(group=group)]
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is not None:
        names = [n for n in names if n in allowed.split(",")]
    return sorted({n for n in names if n != PLUGIN_NAME})


@contextmanager
def stock_vllm() -> Iterator[None]:
    """Start engines inside this block without gatehead's plugin: their processes run no gatehead code.

    vLLM loads every `vllm.general_plugins` entry point in each process it starts unless
    `VLLM_PLUGINS` names the ones to load; this sets it to the others for the block. Spawned engine
    processes read it when they start. An engine core run inside this process
    (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, as the test suite does) shares this process's vLLM, where
    gatehead's plugin may already be loaded: only the multi-process layout gives a stock process.
    """
    previous = os.environ.get("VLLM_PLUGINS")
    os.environ["VLLM_PLUGINS"] = ",".join(other_vllm_plugins())
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("VLLM_PLUGINS", None)
        else:
            os.environ["VLLM_PLUGINS"] = previous


def register() -> None:
    """Register the gated architectures, wrap the runner, the prefix-cache lookup and the frontend (idempotent)."""
    from vllm import ModelRegistry

    known = set(ModelRegistry.get_supported_archs())
    for gated in GATED_ARCHITECTURES.values():
        if gated not in known:
            ModelRegistry.register_model(gated, f"gatehead.runtime.gated:{gated}")
    _wrap_model_forward()
    _wrap_prefix_cache_lookup()
    from gatehead.runtime import frontend

    frontend.install()  # the gate's start-up checks and prompt rules, where requests arrive


def _wrap_prefix_cache_lookup() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    original = KVCacheManager.get_computed_blocks
    if getattr(original, "gatehead_wrapped", False):
        return

    def get_computed_blocks(self, request):
        blocks, hits, boundary = original(self, request)
        length = suffix_length(request.sampling_params)
        if length and hits:
            # Whole blocks only (every group's block size divides the hit), ending at or before the suffix.
            block = max(manager.block_size for manager in self.coordinator.single_type_managers)
            limit = max(0, request.num_prompt_tokens - length) // block * block  # a too-long suffix: no hit
            if hits > limit:
                blocks, hits = self.truncate_computed_blocks(blocks, limit), limit
        return blocks, hits, boundary

    get_computed_blocks.gatehead_wrapped = True
    KVCacheManager.get_computed_blocks = get_computed_blocks


def _wrap_model_forward() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._model_forward
    if getattr(original, "gatehead_wrapped", False):
        return

    def _model_forward(self, *args, **kwargs):
        state = getattr(self.get_model(), "gatehead", None)
        if state is None:
            return original(self, *args, **kwargs)
        state.begin_step(*plan_step(self, len(state.rows.suffix_ids), state.rows.suffix_mode))
        output = original(self, *args, **kwargs)
        # Here, not in the model's forward: a full CUDA graph replays the forward without its Python.
        state.after_forward()
        return output

    _model_forward.gatehead_wrapped = True
    GPUModelRunner._model_forward = _model_forward


class WorkerExtension:
    """Methods vLLM mixes into gated engines' workers (`worker_extension_cls`), for `collective_rpc`."""

    def gatehead_memory(self) -> dict[str, int]:
        """The itemised bytes the plugin allocated in this worker."""
        return self.model_runner.get_model().gatehead.memory_bytes()

    def gatehead_branch_timing(self) -> dict[str, float]:
        """How long the branch took in the steps it ran, and the gate rows it keeps now, in this worker."""
        state = self.model_runner.get_model().gatehead
        return {**state.timing.snapshot(), "branch_rows_kept": state.rows.rows_kept(),
                "gate_restarts": state.rows.restarts}

    def gatehead_inject_fault(self, kind: str, scale: float) -> None:
        """A fault drill in this worker (`SharedEngine.inject_fault`): scale the KV caches or the gate head."""
        runner = self.model_runner
        if kind == "kv":
            for cache in runner.kv_caches:
                cache.mul_(scale)
            return
        branch = runner.get_model().gatehead.branch
        if not hasattr(self, "gatehead_head_as_loaded"):
            self.gatehead_head_as_loaded = branch.head.clone()
        if kind == "branch":
            branch.head.mul_(scale)
        else:
            branch.head.copy_(self.gatehead_head_as_loaded)


def plan_step(runner: Any, suffix_len: int, suffix_mode: bool = False) -> tuple[list[Any], set[str]]:
    """This step's gate rows (`GateRow`s) and the ids of the requests the V1 model runner holds.

    In suffix mode a gate's first kept row is its first suffix position, and a gate whose prompt
    completes this step carries the KV block ids of the positions before it (group 0: suffix mode
    runs on full-attention models only, whose layers share one KV cache group; `GateState` checks).
    """
    from gatehead.runtime.gated import GateRow

    batch = runner.input_batch
    starts = runner.query_start_loc.np
    rows = []
    for i, req_id in enumerate(batch.req_ids):
        state = runner.requests[req_id]
        if not is_gate_request(state.sampling_params):
            continue
        done, prompt_len = int(batch.num_computed_tokens_cpu[i]), state.num_prompt_tokens
        if done >= prompt_len:
            continue
        tail = tuple(state.prompt_token_ids[-suffix_len:]) if state.prompt_token_ids else ()
        first, blocks = 0, ()
        end = int(starts[i + 1])
        if suffix_mode:
            first = max(prompt_len - suffix_len, 0)
            if done + end - int(starts[i]) >= prompt_len:  # the last chunk: the branch reads the prefix's K/V
                table = batch.block_table[0]
                blocks = tuple(int(b) for b in table.get_numpy_array()[i, :-(-first // table.block_size)])
        rows.append(GateRow(req_id, i, int(starts[i]), end, done, prompt_len, tail, first, blocks))
    return rows, set(runner.requests)
