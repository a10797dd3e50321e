"""The gate's rules in vLLM's frontend: start-up checks and per-request prompt rules, whatever serves the engine.

vLLM turns every request into an `EngineCoreRequest` in one place, `InputProcessor.process_inputs`, in
the process that accepts requests: gatehead's `SharedEngine`, or the API server of a stock `vllm serve`
started with gatehead's flags (`gatehead vllm-args`). The plugin wraps that class (`install`), so the same
rules hold in both, and a request they refuse is vLLM's `VLLMValidationError`: an exception in process,
an HTTP 400 with vLLM's error body from its OpenAI server.

- At start (`GateRules.of`, when the `InputProcessor` is built, before the engine core starts): the
  adapter against the base, the wiring's token ids against the tokenizer, the admission hook the
  request rules need, and what the branch does not support. A server started with hand-written flags
  gets the errors the in-process engine gives, and never reports ready.
- Per request (`GateRules.admit`, on the final token ids and the request's own copy of its params):
  a gate prompt ends with exactly one suffix and carries no reserved token before it, fits
  `max_gate_tokens`, and a suffix-mode gate names the suffix's length; a prompt-mode gate is made to
  compute every prompt row (it may not read the prefix cache; over HTTP no field says so). A
  generation prompt (completions, chat, any entry point) may carry no reserved token, so no text can
  invoke the gate. `SamplingParams`-level rules stay in `gatehead.runtime.admission`.
Engines without gatehead's wiring (stock engines, vLLM's other models) are left exactly as vLLM made them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gatehead.runtime.plugin import SUFFIX_FLAG, is_gate_request, suffix_length

ADMISSION = "gatehead.runtime.admission"


def admission_hook(suffix_mode: bool) -> str:
    """The `--logits-processors` value a gated engine needs (its `validate_params` rules)."""
    return f"{ADMISSION}:{'SuffixGateAdmission' if suffix_mode else 'GateAdmission'}"


@dataclass(frozen=True)
class GateRules:
    """What one gated engine admits: its suffix, reserved ids, longest gate prompt and gate mode."""

    suffix_ids: tuple[int, ...]
    reserved: frozenset[int]  # the suffix's reserved token and the action tokens
    max_gate_tokens: int
    suffix_mode: bool

    @classmethod
    def of(cls, vllm_config: Any, tokenizer: Any = None) -> GateRules | None:
        """The rules of an engine built from `vllm_config`, checked as the in-process engine checks them;
        None for an engine without gatehead's wiring. `tokenizer`: the engine's (else the model's is loaded)."""
        from gatehead.runtime import checks
        from gatehead.runtime.wiring import KEY, Wiring

        model_config = vllm_config.model_config
        if getattr(model_config.hf_config, KEY, None) is None:
            return None
        from gatehead.gate.adapter import load_gate_adapter
        from gatehead.gate.prompt import reserved_token_id

        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_config.tokenizer)
        wiring = Wiring.of(model_config.hf_config)
        # The base, its reserved tokens (on the engine's own tokenizer), the LoRA and the head.
        adapter = load_gate_adapter(wiring.adapter, model_config.model, tokenizer=tokenizer)
        checks.unsupported_config(vllm_config)
        hook = admission_hook(adapter.suffix_mode)
        loaded = [p if isinstance(p, str) else f"{p.__module__}:{p.__qualname__}"
                  for p in model_config.logits_processors or []]
        if hook not in loaded:
            raise ValueError(f"a gated engine needs gatehead's request rules for this adapter: start it with "
                             f"--logits-processors {hook} (`gatehead vllm-args` prints every flag)")
        problems = {
            "prompt embeddings (--enable-prompt-embeds): a gate is told apart by its token ids":
                model_config.enable_prompt_embeds,
            "logprobs modes other than raw_logprobs (the gate's probabilities are the raw log-softmax of its "
            "head)": model_config.logprobs_mode != "raw_logprobs",
        }
        if adapter.suffix_mode:
            problems["KV transfer or offloading (--kv-transfer-config): a suffix-mode gate computes its suffix "
                     "rows in the engine"] = vllm_config.kv_transfer_config is not None
        refused = [name for name, present in problems.items() if present]
        if refused:
            raise ValueError(f"gatehead's gated engine does not support {'; '.join(refused)}")
        suffix_ids = tuple(tokenizer.encode(adapter.spec.suffix, add_special_tokens=False))
        action_ids = tuple(reserved_token_id(tokenizer, t) for t in adapter.spec.action_tokens)
        if (suffix_ids, action_ids) != (wiring.suffix_ids, wiring.action_ids):
            raise ValueError(f"the wiring's token ids (suffix {list(wiring.suffix_ids)}, actions "
                             f"{list(wiring.action_ids)}) are not this adapter's on this tokenizer (suffix "
                             f"{list(suffix_ids)}, actions {list(action_ids)}): print the flags again with "
                             f"`gatehead vllm-args`")
        if not 0 < wiring.max_gate_tokens <= model_config.max_model_len:
            raise ValueError(f"max_gate_tokens={wiring.max_gate_tokens} must lie in [1, max_model_len="
                             f"{model_config.max_model_len}]")
        return cls(suffix_ids, frozenset(action_ids) | frozenset(suffix_ids[-1:]), wiring.max_gate_tokens,
                   adapter.suffix_mode)

    def admit(self, request: Any) -> None:
        """Refuse (`VLLMValidationError`) a request whose prompt breaks the rules; set what a prompt-mode gate
        needs on the request's own params."""
        from vllm.exceptions import VLLMValidationError

        params = request.sampling_params
        if params is None:  # a pooling request: never a gate, and it prints nothing
            return
        ids = request.prompt_token_ids
        if ids is None:
            raise VLLMValidationError("a gated engine needs a prompt's token ids (prompt embeddings are refused)",
                                      parameter="prompt")
        if not is_gate_request(params):
            if self.reserved.intersection(ids):
                raise VLLMValidationError("the prompt contains the gate's reserved tokens (its suffix or action "
                                          "tokens); generation prompts may not", parameter="prompt")
            return
        n = len(self.suffix_ids)
        problems = []
        if tuple(ids[-n:]) != self.suffix_ids:
            problems.append("a gate prompt must end with the adapter's invocation suffix")
        if self.reserved.intersection(ids[:-n]):
            problems.append("a gate prompt may carry no reserved gate token before its suffix (untrusted text is "
                            "tokenized with special-token parsing off)")
        if len(ids) > self.max_gate_tokens:
            problems.append(f"the gate prompt has {len(ids)} tokens, over the engine's max_gate_tokens="
                            f"{self.max_gate_tokens}")
        if self.suffix_mode and suffix_length(params) != n:
            problems.append(f"a suffix-mode gate names its suffix length: {SUFFIX_FLAG} = {n}")
        if problems:
            raise VLLMValidationError("; ".join(problems), parameter="prompt")
        if not self.suffix_mode:
            params.skip_reading_prefix_cache = True  # every prompt row is computed, where the tap sees it


def install() -> None:
    """Wrap vLLM's `InputProcessor` (idempotent): its construction reads the rules, `process_inputs` applies them."""
    from vllm.v1.engine.input_processor import InputProcessor

    if getattr(InputProcessor.process_inputs, "gatehead_wrapped", False):
        return
    init, process = InputProcessor.__init__, InputProcessor.process_inputs

    def __init__(self, vllm_config, *args, **kwargs):
        init(self, vllm_config, *args, **kwargs)
        # Before the engine core starts (it starts after this object): a refused configuration starts nothing.
        self.gatehead_rules = GateRules.of(vllm_config, self.tokenizer)

    def process_inputs(self, *args, **kwargs):
        request = process(self, *args, **kwargs)
        rules = getattr(self, "gatehead_rules", None)
        if rules is not None:
            rules.admit(request)
        return request

    process_inputs.gatehead_wrapped = True
    InputProcessor.__init__ = __init__
    InputProcessor.process_inputs = process_inputs
