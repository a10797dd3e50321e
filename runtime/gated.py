"""The gated causal LMs that vLLM loads through the plugin: base model + tap + gate branch + gate rows in logits.

Per step (see `gatehead.runtime.plugin` for where the plan comes from):
1. `begin_step(rows, live)`: the gate requests scheduled this step, their rows in the flattened batch;
2. the base forward runs unchanged (compiled or eager); the tap copies layer N-k's residual rows;
3. `after_forward()`: gate rows of this step are retained; a prompt whose last chunk arrived runs
   through the branch;
4. `apply(logits)`: each finished gate request's logits row becomes -inf except the three reserved
   action tokens, which carry the head's logits; vLLM's `logprob_token_ids` returns their log-softmax.

Generation rows are never touched. A gate request whose rows cannot be complete (it read the prefix
cache, or its prompt does not end with the suffix) gets NaN action logits: the engine reports an
error for it instead of a guess.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from gatehead.gate.adapter import load_gate_adapter
from gatehead.gate.policy import LABELS
from gatehead.runtime.branch import GateBranch
from gatehead.runtime.tap import tap_norm


@dataclass(frozen=True)
class GateRow:
    """One gate request's share of a step."""

    req_id: str
    batch_row: int  # its row in compute_logits' input
    start: int  # its token rows in the flattened batch: [start, end)
    end: int
    done: int  # prompt tokens computed before this step
    prompt_len: int
    prompt_tail: tuple[int, ...]  # the last prompt tokens, as long as the suffix


class GateState(nn.Module):
    """What the plugin adds to a model: the tap buffer, the branch, rows retained across chunks."""

    def __init__(self, model: nn.Module, vllm_config) -> None:
        super().__init__()
        model_config = vllm_config.model_config
        hf = model_config.hf_config
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise ValueError("gatehead does not support pipeline parallelism yet; use tensor parallelism")
        adapter = load_gate_adapter(hf.gatehead_adapter, model_config.model, check_tokens=False)
        layers = model.model.layers
        dtype = model_config.dtype
        self.suffix_ids = tuple(hf.gatehead_suffix_ids)
        order = [adapter.spec.labels.index(label) for label in LABELS]
        self.head_order = order  # head row for each canonical label
        self.register_buffer("action_ids", torch.tensor(hf.gatehead_action_ids, dtype=torch.long), persistent=False)
        self.max_gate_tokens = int(hf.gatehead_max_gate_tokens)
        self.branch = GateBranch(list(layers[adapter.branch_layer:]), model.model.norm, adapter, dtype)
        max_rows = vllm_config.scheduler_config.max_num_batched_tokens
        self.register_buffer("tap_buffer", torch.zeros(max_rows, hf.hidden_size, dtype=dtype), persistent=False)
        tap_norm(layers[adapter.branch_layer].input_layernorm, self.tap_buffer,
                 perturbed=getattr(hf, "gatehead_tap", "copy") == "perturbed")
        self.retained: dict[str, list[torch.Tensor]] = {}
        self.failed: set[str] = set()
        self.plan: list[GateRow] = []
        self.results: dict[int, torch.Tensor] = {}

    def begin_step(self, rows: list[GateRow], live: set[str]) -> None:
        """Take this step's gate rows; forget requests vLLM no longer holds (finished, aborted)."""
        for req_id in [r for r in self.retained if r not in live]:
            del self.retained[req_id]
        self.failed &= live
        for row in rows:
            if row.done == 0:  # a (re)started prefill: preemption recomputes from scratch
                self.retained[row.req_id] = []
                self.failed.discard(row.req_id)
            if (row.req_id not in self.retained or row.prompt_tail != self.suffix_ids
                    or row.prompt_len > self.max_gate_tokens):
                self.failed.add(row.req_id)  # rows missing (prefix-cache read) or not a gate prompt
                self.retained.pop(row.req_id, None)
        self.plan = rows

    def after_forward(self) -> None:
        """Retain this step's tapped gate rows; run the branch for prompts now complete."""
        plan, self.plan = self.plan, []
        for row in plan:
            if row.req_id not in self.failed:
                self.retained[row.req_id].append(self.tap_buffer[row.start:row.end].clone())
            if row.done + (row.end - row.start) < row.prompt_len:
                continue
            if row.req_id in self.failed:
                self.results[row.batch_row] = torch.full((3,), float("nan"), device=self.tap_buffer.device)
                continue
            rows = torch.cat(self.retained.pop(row.req_id))
            assert rows.shape[0] == row.prompt_len, (rows.shape, row)
            self.results[row.batch_row] = self.branch(rows)[self.head_order]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Gate rows of `logits` -> the head's logits on the action tokens; other rows untouched."""
        if not self.results:
            return logits
        results, self.results = self.results, {}
        # fp32 so the head's logits keep their precision; the sampler casts to fp32 first anyway,
        # so generation rows sample and score exactly as before.
        logits = logits.float()
        for batch_row, head_logits in results.items():
            logits[batch_row] = float("-inf")
            logits[batch_row, self.action_ids] = head_logits
        return logits

    def memory_bytes(self) -> dict[str, int]:
        """Itemised bytes the plugin allocates (retained rows: the bound, one maximal gate prompt)."""
        row_bytes = self.tap_buffer.shape[1] * self.tap_buffer.element_size()
        return {
            "lora_and_head": self.branch.memory_bytes(),
            "tap_buffer": self.tap_buffer.numel() * self.tap_buffer.element_size(),
            "retained_rows_bound": self.max_gate_tokens * row_bytes,
        }


class GatedQwen3ForCausalLM(Qwen3ForCausalLM):
    """Qwen3 causal LM that also answers gate requests from the same weights."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.gatehead = GateState(self, vllm_config)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs):
        hidden_states = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds, **kwargs)
        self.gatehead.after_forward()
        return hidden_states

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.gatehead.apply(super().compute_logits(hidden_states))
