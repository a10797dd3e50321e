"""The setups `gatehead bench` compares, each behind the engine interface the agent uses.

- the shared engine itself (`SharedEngine` with a prompt-mode or a suffix-mode gate adapter);
- `TwoEngines`: stock vLLM generating beside the dedicated gate engine (`DedicatedGate`: the exported
  gate classifier on stock vLLM's pooling runner, prefix caching on);
- `Ungated`: an engine answering every turn without a gate (the shared engine, or stock vLLM);
- `PromptedJudge`: a stock engine asked, after the gate prompt's prefix, whether to answer, refuse or
  search, scored on the three label words' next-token logprobs (one token; reads the prefix cache).

Every gate returns `GateOutcome`s under the thresholds the agent passes; the benchmark's make every turn
answer (`ALWAYS_ANSWER`), so the setups do the same retrieval and generation work and differ only in the
gate, or every turn refuse (`ALWAYS_REFUSE`: what an answer started beside its gate wastes).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Sequence
from pathlib import Path

from gatehead.gate.policy import LABELS, Thresholds, gate_result
from gatehead.gate.prompt import Prompt, PromptBuilder, PromptConfig, encode_untrusted
from gatehead.runtime.cpu_setup import cpu_set_up
from gatehead.runtime.engine import GateOutcome, SharedEngine, final_output
from gatehead.runtime.plugin import stock_vllm

ALWAYS_ANSWER = Thresholds(answer=0.0, refuse=1.0)
ALWAYS_REFUSE = Thresholds(answer=1.0, refuse=0.0)  # but a gate certain to answer (p = 1.0) answers
JUDGE_INSTRUCTION = ("\n\nShould the assistant answer from these documents, refuse, or search for more? "
                     "Reply with one word: answer, refuse or search.\nDecision:")


class DedicatedGate:
    """The dedicated gate engine: stock vLLM's pooling runner on the exported gate classifier."""

    def __init__(self, export_dir: Path, max_model_len: int, memory_fraction: float, eager: bool,
                 block_size: int | None, dtype: str = "bfloat16") -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        meta = json.loads((export_dir / "gatehead_dedicated.json").read_text())
        self.order = [list(meta["labels"]).index(label) for label in LABELS]
        # vLLM supports prefix caching for causal pooling models with last-token pooling, as this one is.
        args = dict(model=str(export_dir), runner="pooling", dtype=dtype, max_model_len=max_model_len,
                    gpu_memory_utilization=memory_fraction, enforce_eager=eager, seed=0, enable_prefix_caching=True)
        if block_size:
            args["block_size"] = block_size
        with stock_vllm(), cpu_set_up():  # stock vLLM, no gatehead code in its processes; the same CPU set-up
            self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    async def probs(self, prompt_ids: Sequence[int]) -> dict[str, float]:
        from vllm import PoolingParams

        final = await final_output(self.llm.encode({"prompt_token_ids": list(prompt_ids)},
                                                   PoolingParams(task="classify"),
                                                   request_id=f"dgate-{uuid.uuid4().hex}"))
        row = final.outputs.data.tolist()
        return {label: float(row[i]) for label, i in zip(LABELS, self.order, strict=True)}

    @property
    def prefix_caching(self) -> bool:
        return bool(self.llm.vllm_config.cache_config.enable_prefix_caching)

    @property
    def kv_tokens(self) -> int:
        cache = self.llm.vllm_config.cache_config
        return int(cache.num_gpu_blocks) * int(cache.block_size)

    def engine_pids(self) -> list[int]:
        return [p.pid for p in self.llm.engine_core.resources.engine_manager.processes]

    def shutdown(self) -> None:
        self.llm.shutdown()
        del self.llm


class _Generating:
    """Generation through `self.generator`; `gate_laid_out` times a gate on a prompt already laid out."""

    generator: SharedEngine
    prompts: PromptBuilder

    def stream(self, prompt, **kwargs):
        return self.generator.stream(prompt, **kwargs)

    async def generate(self, prompt, **kwargs):
        return await self.generator.generate(prompt, **kwargs)

    async def gate(self, question, passages=(), conversation=(), thresholds=None, cache_salt=None) -> GateOutcome:
        return await self.gate_laid_out(self.prompts.build(question, passages, conversation),
                                        thresholds or ALWAYS_ANSWER)

    async def gate_laid_out(self, prompt: Prompt, thresholds: Thresholds = ALWAYS_ANSWER) -> GateOutcome:
        raise NotImplementedError


class SharedGate(_Generating):
    """The shared engine with its own gate (prompt or suffix mode)."""

    def __init__(self, engine: SharedEngine) -> None:
        self.generator, self.adapter, self.tokenizer, self.prompts = engine, engine.adapter, engine.tokenizer, \
            engine.prompts

    async def gate_laid_out(self, prompt: Prompt, thresholds: Thresholds = ALWAYS_ANSWER) -> GateOutcome:
        outcome = await self.generator.gate_prompt(prompt.gate, thresholds)
        return GateOutcome(outcome.result, prompt, outcome.num_prompt_tokens, outcome.num_cached_tokens)


class TwoEngines(_Generating):
    """Stock vLLM generates, the dedicated engine gates."""

    def __init__(self, generator: SharedEngine, gate: DedicatedGate, adapter) -> None:
        self.generator, self.dedicated, self.adapter = generator, gate, adapter
        self.tokenizer = generator.tokenizer
        self.prompts = PromptBuilder(self.tokenizer, adapter.spec.suffix,
                                     PromptConfig(max_context=generator.max_model_len))

    async def gate_laid_out(self, prompt: Prompt, thresholds: Thresholds = ALWAYS_ANSWER) -> GateOutcome:
        probs = await self.dedicated.probs(prompt.gate)
        return GateOutcome(gate_result(probs, thresholds), prompt, len(prompt.gate), 0)


class Ungated(_Generating):
    """An engine answering every turn without a gate (the prompt laid out as the gate's `adapter` lays it
    out): the shared engine with its adapter loaded, or a stock engine with gatehead's plugin left out."""

    def __init__(self, engine: SharedEngine, adapter) -> None:
        self.generator, self.adapter, self.tokenizer = engine, adapter, engine.tokenizer
        self.prompts = engine.prompts or PromptBuilder(self.tokenizer, adapter.spec.suffix,
                                                       PromptConfig(max_context=engine.max_model_len))

    async def gate_laid_out(self, prompt: Prompt, thresholds: Thresholds = ALWAYS_ANSWER) -> GateOutcome:
        probs = {"answer": 1.0, "refuse": 0.0, "search": 0.0}
        return GateOutcome(gate_result(probs, ALWAYS_ANSWER), prompt, len(prompt.gate), 0)


class PromptedJudge(_Generating):
    """A stock engine judging in words: the gate prompt's prefix, `JUDGE_INSTRUCTION`, then the next token's
    logprobs of the three label words (their first tokens), renormalised over the three."""

    def __init__(self, engine: SharedEngine, adapter) -> None:
        self.generator, self.adapter, self.tokenizer = engine, adapter, engine.tokenizer
        self.prompts = PromptBuilder(self.tokenizer, adapter.spec.suffix,
                                     PromptConfig(max_context=engine.max_model_len))
        self.instruction = tuple(encode_untrusted(self.tokenizer, JUDGE_INSTRUCTION))
        self.words = [encode_untrusted(self.tokenizer, " " + label)[0] for label in LABELS]
        if len(set(self.words)) < len(LABELS):
            raise ValueError(f"this tokenizer starts the label words {LABELS} with the same token: the prompted "
                             f"judge cannot tell them apart in one token")

    async def gate_laid_out(self, prompt: Prompt, thresholds: Thresholds = ALWAYS_ANSWER) -> GateOutcome:
        ids = prompt.prefix + self.instruction
        logprobs, cached = await self.generator.next_token_logprobs(ids, self.words)
        top = max(logprobs)
        weights = [math.exp(lp - top) for lp in logprobs]
        probs = {label: w / sum(weights) for label, w in zip(LABELS, weights, strict=True)}
        return GateOutcome(gate_result(probs, thresholds), prompt, len(ids), cached)
