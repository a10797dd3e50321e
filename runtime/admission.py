"""Request rules of gated engines, enforced inside vLLM for every request, whatever entry point sent it.

gatehead installs this as a vLLM logits processor (`logits_processors=[...]`) for one hook of it:
`validate_params`, which vLLM runs in the engine's client for each request before queueing it.
- A gate request asking for what the branch cannot honour (n > 1, structured output, prompt
  logprobs, ...) is refused there with the reason, and nothing runs.
- A suffix-mode gate (`SuffixGateAdmission`, chosen for a suffix-mode adapter) must name its suffix
  length, which the scheduler reads to keep its suffix rows uncached. (A prompt-mode gate computes every
  prompt row: `gatehead.runtime.frontend` sets that on the request, with the rules that need its prompt.)
- A generation request may not turn off `skip_special_tokens`: the gate's reserved tokens (the
  invocation suffix and the action tokens) are special tokens, so they never reach generated text.
Logits are left alone (`apply` is the identity): masking the reserved tokens would change the
greedy output of any model that ranks one first, and generation must stay numerically unchanged.
A trained model practically never samples them; their ids can appear only in raw token output.
This module does not route gate requests; the worker does (`gatehead.runtime.plugin.plan_step`).
"""

from __future__ import annotations

import torch
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor

from gatehead.runtime.plugin import SUFFIX_FLAG, is_gate_request, suffix_length


class GateAdmission(LogitsProcessor):
    """Refuses gate requests the branch cannot serve, and generations that would print reserved tokens."""

    suffix_mode = False

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        p = sampling_params
        if not is_gate_request(p):
            if not p.skip_special_tokens:
                raise VLLMValidationError("a gated engine keeps special tokens out of generated text (the gate's "
                                          "reserved tokens are special tokens): leave skip_special_tokens=True")
            return
        refused = {
            "n > 1 (a gate decision is one result; send one gate request per decision)": p.n > 1,
            "structured output (the gate's output is three probabilities, not text)": p.structured_outputs is not None,
            "prompt logprobs (the branch replaces the model's output on the last token only)":
                p.prompt_logprobs is not None,
            "max_tokens other than 1 (a gate request ends at its decision)": p.max_tokens != 1,
        }
        if cls.suffix_mode:
            refused[f"a suffix-mode gate without its suffix length (extra_args[{SUFFIX_FLAG!r}] = the number of "
                    f"suffix tokens)"] = suffix_length(p) == 0
        problems = [reason for reason, present in refused.items() if present]
        if problems:
            raise VLLMValidationError(f"gate requests do not support {'; '.join(problems)}")

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        pass

    def is_argmax_invariant(self) -> bool:
        return True  # it changes no logits; vLLM skips it where only the argmax matters

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits


class SuffixGateAdmission(GateAdmission):
    """The rules of an engine serving a suffix-mode gate: its gate requests name their suffix length."""

    suffix_mode = True
