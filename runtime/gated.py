"""The gated causal LMs that vLLM loads through the plugin: base model + tap + gate branch + gate rows in logits.

Per step (`gatehead.runtime.plugin` wraps the runner's `_model_forward` around steps 2-3):
1. `begin_step(rows, live)`: the gate requests scheduled this step and their rows in the flattened batch;
2. the base forward runs unchanged (compiled, eager or a CUDA graph); the tap copies the inputs of layer N-k's norm;
3. `after_forward()`: this step's gate rows are kept; the prompts whose last chunk arrived run the branch,
   all in one batched pass;
4. `compute_logits`: each finished gate request's logits row becomes -inf except the three reserved
   action tokens, which carry the head's logits; vLLM's `logprob_token_ids` returns their log-softmax.

Generation rows are never touched. A gate request whose rows cannot be complete (a prompt-mode gate
that read the prefix cache, a suffix-mode one that read it past its suffix's start, one resumed
mid-prompt, or a prompt that does not end with the suffix) gets -inf action logits, its probability
on another token: the engine reports an error for it instead of a guess (finite, not NaN, so that
vLLM's HTTP server can render the response; the client's probability check fails).

A suffix-mode (activated) gate keeps only its suffix rows; the branch reads the prefix's base K/V
from the paged KV cache through the request's block ids (`gatehead.runtime.branch.Prefix`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from gatehead.gate.adapter import load_gate_adapter
from gatehead.gate.policy import LABELS
from gatehead.runtime import checks
from gatehead.runtime.branch import GateBranch, Prefix, Workspace
from gatehead.runtime.tap import tap_norm
from gatehead.runtime.wiring import Wiring


@dataclass(frozen=True)
class GateRow:
    """One gate request's share of a step."""

    req_id: str
    batch_row: int  # its row in compute_logits' input
    start: int  # its token rows in the flattened batch: [start, end)
    end: int
    done: int  # prompt tokens computed before this step
    prompt_len: int
    prompt_tail: tuple[int, ...]  # the last prompt tokens, as many as the suffix has
    first: int = 0  # its first kept position: 0 in prompt mode, the first suffix position in suffix mode
    blocks: tuple[int, ...] = ()  # suffix mode, last chunk: KV block ids of positions [0, first)

    @property
    def last_chunk(self) -> bool:
        return self.done + (self.end - self.start) >= self.prompt_len

    def kept_after(self) -> int:
        """Rows this request keeps once this step's rows are collected."""
        return max(0, self.done + (self.end - self.start) - self.first)


class RowKeeper:
    """Keeps gate requests' tapped rows across chunked-prefill steps; knows which prompts are complete.

    A prompt-mode gate keeps every prompt row; a suffix-mode gate keeps the rows of its suffix only
    (positions `>= first`), the prefix being read from the KV cache. A request's kept rows must be
    exactly positions `[first, done)` when a step begins: a request that read the prefix cache past
    `first`, or resumed without its rows, fails (NaN logits, an error for the caller) rather than
    gating on part of its prompt. A preempted request that restarts at or before `first` starts over.

    At most `max_rows` rows stay kept between steps (one maximal gate prompt: vLLM's scheduler keeps
    at most one request partially prefilled); a request that would exceed it fails instead of growing
    memory. Rows of a prompt that completes in the step are not counted against the bound: they are
    handed to the branch and dropped in the same step.
    """

    def __init__(self, suffix_ids: tuple[int, ...], max_rows: int, suffix_mode: bool = False) -> None:
        self.suffix_ids = suffix_ids
        self.max_rows = max_rows
        self.suffix_mode = suffix_mode
        self.kept: dict[str, list[torch.Tensor]] = {}
        self.failed: set[str] = set()
        self.plan: list[GateRow] = []
        self.reached: dict[str, int] = {}  # each live gate's prompt tokens computed so far
        self.restarts = 0  # gate prefills that started over (preempted, then recomputed)

    def begin_step(self, rows: list[GateRow], live: set[str]) -> None:
        for req_id in [r for r in self.kept if r not in live]:  # finished or aborted
            del self.kept[req_id]
        self.failed &= live
        self.reached = {r: n for r, n in self.reached.items() if r in live}
        for row in rows:
            self.restarts += row.done < self.reached.get(row.req_id, 0)
            self.reached[row.req_id] = row.done + (row.end - row.start)
        scheduled = {row.req_id for row in rows}
        retained = sum(t.shape[1] for req_id, kept in self.kept.items() if req_id not in scheduled for t in kept)
        for row in rows:
            needed = max(0, row.done - row.first)  # rows computed in earlier steps that must be kept
            if needed == 0:  # a (re)started prefill: preemption recomputes from a position <= first
                self.kept[row.req_id] = []
                self.failed.discard(row.req_id)
            kept = self.kept.get(row.req_id)
            if (kept is None or sum(t.shape[1] for t in kept) != needed or row.prompt_tail != self.suffix_ids
                    or row.prompt_len - row.first > self.max_rows):
                self._fail(row.req_id)  # rows missing or not a gate prompt
            elif not row.last_chunk:  # its rows stay kept after this step
                retained += row.kept_after()
                if retained > self.max_rows:
                    self._fail(row.req_id)
                    retained -= row.kept_after()
        self.plan = rows

    def _fail(self, req_id: str) -> None:
        self.failed.add(req_id)
        self.kept.pop(req_id, None)

    def collect(self, tap_buffer: torch.Tensor) -> list[tuple[GateRow, torch.Tensor | None]]:
        """Keep this step's rows of `tap_buffer` [2, tokens, hidden]; return (row, its kept rows [2, L, hidden]
        or None if failed) per completed prompt."""
        plan, self.plan = self.plan, []
        complete = []
        for row in plan:
            skip = max(0, row.first - row.done)  # this step's rows before the first kept position
            if row.req_id not in self.failed and row.start + skip < row.end:
                self.kept[row.req_id].append(tap_buffer[:, row.start + skip:row.end].clone())
            if not row.last_chunk:
                continue
            if row.req_id in self.failed:
                complete.append((row, None))
            else:
                complete.append((row, torch.cat(self.kept.pop(row.req_id), dim=1)))
        return complete

    def rows_kept(self) -> int:
        return sum(t.shape[1] for rows in self.kept.values() for t in rows)


@dataclass
class BranchTiming:
    """Wall time of the branch in the steps where it ran (collecting rows included), in this worker."""

    steps: int = 0
    prompts: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0

    def add(self, seconds: float, prompts: int) -> None:
        self.steps += 1
        self.prompts += prompts
        self.seconds += seconds
        self.max_seconds = max(self.max_seconds, seconds)

    def snapshot(self) -> dict[str, float]:
        return {"branch_steps": self.steps, "branch_prompts": self.prompts, "branch_seconds": self.seconds,
                "branch_ms_per_step": 1000 * self.seconds / self.steps if self.steps else 0.0,
                "branch_ms_max": 1000 * self.max_seconds}


class GateState(nn.Module):
    """What the plugin adds to a model: the tap buffer, the branch, rows retained across chunks."""

    def __init__(self, model: nn.Module, vllm_config) -> None:
        super().__init__()
        checks.unsupported_config(vllm_config)
        model_config = vllm_config.model_config
        wiring = Wiring.of(model_config.hf_config)
        hf = model_config.hf_config
        # Checked against the base by the engine that wired it: read here, not checked again.
        adapter = load_gate_adapter(wiring.adapter, model_config.model, check_tokens=False)
        layers = model.model.layers
        dtype = model_config.dtype
        max_rows = vllm_config.scheduler_config.max_num_batched_tokens
        # Layer N-k's norm inputs (hidden, residual) per batched token. Created under vLLM's target-device
        # context: the buffer lands where the model does.
        self.register_buffer("tap_buffer", torch.zeros(2, max_rows, hf.hidden_size, dtype=dtype), persistent=False)
        device = self.tap_buffer.device
        self.register_buffer("action_ids", torch.tensor(wiring.action_ids, dtype=torch.long, device=device),
                             persistent=False)
        # Where a failed gate row puts its probability: the first id that is no action token.
        self.failed_token = next(t for t in range(len(wiring.action_ids) + 1) if t not in wiring.action_ids)
        self.head_order = [adapter.spec.labels.index(label) for label in LABELS]  # head row per canonical label
        branch_mode = wiring.branch  # True, False or "suffix-only" (a negative control)
        self.suffix_mode = adapter.suffix_mode
        if self.suffix_mode:
            checks.kv_readable_config(vllm_config, layers[adapter.branch_layer])
        elif branch_mode == "suffix-only":
            raise ValueError("the 'suffix-only' branch is a negative control of suffix-mode gates; this adapter is "
                             "prompt-mode")
        suffix_ids, max_gate_tokens = wiring.suffix_ids, wiring.max_gate_tokens
        step_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        # A branch pass takes as many gate requests as fit one maximal gate request or one engine step.
        self.max_query = len(suffix_ids) if self.suffix_mode else max_gate_tokens
        workspace = Workspace(max_keys=max(max_gate_tokens, step_tokens), max_rows=max(self.max_query, step_tokens))
        self.branch = GateBranch(list(layers[adapter.branch_layer:]), model.model.norm, adapter, device, workspace,
                                 attention_fp32=_attention_in_fp32(vllm_config, layers[adapter.branch_layer]),
                                 prefix_keys=branch_mode != "suffix-only",
                                 max_positions=model_config.max_model_len)
        tap = wiring.tap
        if tap != "off":  # "off" and branch=False: the stability check's diagnostic modes
            tap_norm(layers[adapter.branch_layer].input_layernorm, self.tap_buffer, perturbed=tap == "perturbed")
        # No tap, no rows: the branch would read a buffer nothing wrote, so it is off too (gate requests fail).
        self.branch_enabled = branch_mode is not False and tap != "off"
        kept_bound = max_gate_tokens
        if self.suffix_mode:  # each request keeps its suffix rows only
            kept_bound = min(kept_bound, len(suffix_ids) * vllm_config.scheduler_config.max_num_seqs)
        self.rows = RowKeeper(suffix_ids, kept_bound, suffix_mode=self.suffix_mode)
        self.results: dict[int, torch.Tensor | None] = {}
        self.timing = BranchTiming()

    def begin_step(self, rows: list[GateRow], live: set[str]) -> None:
        self.rows.begin_step(rows, live)

    def after_forward(self) -> None:
        """Keep this step's tapped gate rows; run the branch for prompts now complete."""
        if not self.branch_enabled:
            self.rows.plan = []
            return
        started, ready = time.perf_counter(), []
        for row, rows in self.rows.collect(self.tap_buffer):
            if rows is None:
                self.results[row.batch_row] = None  # failed: see `apply`
            else:
                ready.append((row, (rows, Prefix(row.first, row.blocks) if self.suffix_mode else None)))
        if ready:  # one branch pass for every gate prompt completed this step
            logits = self.branch.forward_batch([request for _, request in ready])[:, self.head_order]
            for (row, _), row_logits in zip(ready, logits, strict=True):
                self.results[row.batch_row] = row_logits
        ran = len(ready)
        if ran:
            if self.tap_buffer.is_cuda:  # the results are read in compute_logits right after: no extra stall
                torch.cuda.synchronize(self.tap_buffer.device)
            self.timing.add(time.perf_counter() - started, ran)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Gate rows of `logits` -> the head's logits on the action tokens; other rows untouched."""
        results, self.results = self.results, {}
        if not results or logits is None:  # None: a tensor-parallel rank that does not hold the logits
            return logits
        # fp32 so the head's logits keep their precision; the sampler casts to fp32 first anyway,
        # so generation rows sample and score exactly as before.
        logits = logits.float()
        for batch_row, head_logits in results.items():
            logits[batch_row] = float("-inf")
            if head_logits is None:  # a failed gate: no action is possible, one non-action token is certain
                logits[batch_row, self.failed_token] = 0.0
            else:
                logits[batch_row, self.action_ids] = head_logits
        return logits

    def memory_bytes(self) -> dict[str, int]:
        """Itemised bytes the plugin allocates (retained rows: their bound, one maximal gate prompt; the
        branch's workspace: an estimate of one pass's peak)."""
        row_bytes = 2 * self.tap_buffer.shape[2] * self.tap_buffer.element_size()  # a (hidden, residual) pair
        return {
            **self.branch.memory_bytes(),
            "tap_buffer": self.tap_buffer.numel() * self.tap_buffer.element_size(),
            "retained_rows_bound": self.rows.max_rows * row_bytes,
            "branch_workspace_estimate": self.branch.workspace_bytes(self.max_query, self.tap_buffer.element_size()),
        }


def _attention_in_fp32(vllm_config, layer: nn.Module) -> bool:
    """Whether this engine's attention keeps its probabilities in fp32 (vLLM's CPU "vec" kernels) rather than
    rounding them to the model's dtype before multiplying V (AMX tiles, GPU kernels): the branch matches it."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or vllm_config.model_config.dtype == torch.float32:
        return False
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    cache = vllm_config.cache_config
    isa = _get_attn_isa(vllm_config.model_config.dtype, cache.block_size, layer.self_attn.head_dim, cache.cache_dtype)
    return isa in ("vec", "vec16")


class GateMixin:
    """Makes a vLLM causal LM answer gate requests too: `GateState` attached, gate rows in its logits."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.gatehead = GateState(self, vllm_config)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.gatehead.apply(super().compute_logits(hidden_states))


class GatedQwen3ForCausalLM(GateMixin, Qwen3ForCausalLM):
    """Qwen3 causal LM that also answers gate requests from the same weights."""


class GatedQwen2ForCausalLM(GateMixin, Qwen2ForCausalLM):
    """Qwen2 causal LM that also answers gate requests from the same weights."""


class GatedLlamaForCausalLM(GateMixin, LlamaForCausalLM):
    """Llama causal LM that also answers gate requests from the same weights."""
