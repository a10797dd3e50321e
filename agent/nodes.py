"""The agent's nodes, and the gate as a node for graphs of your own.

Every node is a module-level async function of the graph state and LangGraph's `runtime`, whose
context (`AgentContext`) holds the engine, the store and the settings; nodes never build engines or
stores. The gate, the query rewrite and the answer all run on the one engine; the answer's prompt is
the gate prompt's prefix (same layout, same budget), so it reads the gate's prefill from the cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import asdict
from typing import Any

from langgraph.runtime import Runtime

from gatehead.agent.context import AgentContext, Engine
from gatehead.agent.grounding import grounded, is_refusal
from gatehead.agent.prompts import CLARIFY, NOT_FOUND, REFUSAL
from gatehead.agent.rewrites import joined_question, rewrite_problem
from gatehead.agent.state import AgentState, Decision, as_passage, turns_of
from gatehead.errors import InvalidInput
from gatehead.gate.policy import Thresholds
from gatehead.gate.prompt import Turn
from gatehead.runtime.affinity import affinity

# A gate's answer and a rewrite for another search go before new turns' work where the engine schedules by
# priority (`EngineConfig.scheduling_policy`, lower first); first come, first served (the default) ignores it.
# Measured on the demo model: no gain beyond the run's drift (docs/figures.md, bench-demo-priority).
POST_GATE_PRIORITY = -1

Node = Callable[[AgentState, Runtime[AgentContext]], Awaitable[dict]]


async def gate_decision(engine: Engine, question: str, passages: Sequence[Any], conversation: Sequence[Any] = (),
                        thresholds: Thresholds | None = None, cache_salt: str | None = None) -> dict:
    """Gate `question` over `passages` on the shared engine.

    Returns {"decision", "probs", "thresholds", "prompt_tokens", "cached_tokens", "dropped", "prompt"}; `dropped` names
    what the context budget left out (turn indices, passage sources or indices).
    The building block of the agent's gate node and of `gate_node` for graphs of your own.
    """
    kept = [as_passage(p) for p in passages]
    turns = [t if isinstance(t, Turn) else Turn(t["role"], t["text"]) for t in conversation]
    outcome = await engine.gate(question, kept, turns, thresholds=thresholds, cache_salt=cache_salt)
    prompt = outcome.prompt
    return {"decision": outcome.result.decision, "probs": dict(outcome.result.probs),
            "thresholds": outcome.result.thresholds.to_dict(), "prompt_tokens": outcome.num_prompt_tokens,
            "cached_tokens": outcome.num_cached_tokens,
            "dropped": {"turns": list(prompt.dropped.turns),
                        "passages": [kept[i].source or str(i) for i in prompt.dropped.passages]},
            "prompt": prompt}


def gate_node(engine: Engine, *, question_key: str = "question", passages_key: str = "passages",
              conversation_key: str | None = None, output_key: str = "gate",
              thresholds: Thresholds | None = None) -> Callable[[dict], Awaitable[dict]]:
    """A LangGraph node for a graph of your own: gates `state[question_key]` over `state[passages_key]`.

    Passages may be anything `as_passage` takes (your retriever's documents as they come). The node
    writes `{output_key: {"decision": ..., "probs": {...}, "dropped": {...}}}`; route on it with
    `route_on_gate(output_key)`.
    """

    async def gate(state: dict) -> dict:
        conversation = state.get(conversation_key, ()) if conversation_key else ()
        result = await gate_decision(engine, state[question_key], state.get(passages_key) or (), conversation,
                                     thresholds)
        result.pop("prompt")
        return {output_key: result}

    return gate


def route_on_gate(output_key: str = "gate") -> Callable[[dict], Decision]:
    """A conditional-edge function: the gate's decision ("answer", "refuse" or "search")."""

    def route(state: dict) -> Decision:
        return state[output_key]["decision"]

    return route


def timed(name: str, fn: Node) -> Node:
    """`fn` under its turn's server affinity, adding its run to the state's `timings` (with what it reports under
    `_timing`)."""

    async def node(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
        started = time.perf_counter()
        with affinity(runtime.context.affinity):  # tasks the node starts (a held answer) keep it
            update = await fn(state, runtime)
        entry = {"node": name, "seconds": round(time.perf_counter() - started, 6), **update.pop("_timing", {})}
        return {**update, "timings": [entry]}

    node.__name__ = name
    return node


async def begin(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """Start a turn: its logs afresh, the thread's history kept."""
    question = state.get("question", "")
    if not isinstance(question, str) or not question.strip():
        raise InvalidInput("the question is empty")
    return {"queries": None, "gates": None, "timings": None, "rewrite_fallbacks": None, "searches": 0,
            "decision": "", "answer": "", "refusal_reason": "", "grounded": None, "finish_reason": "stop",
            "error": "", "passages": [], "dropped": {}, "standalone": question, "ask": question,
            "history": state.get("history") or []}


async def clarify(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """A first question that points back at nothing ("And its weight?") is asked back, not guessed."""
    return {"answer": CLARIFY, "decision": "clarify"}


async def contextualize(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """A follow-up made standalone for retrieval; a rewrite that fails its check (`rewrite_problem`) gives
    way to the thread's last question joined with this one."""
    ctx = runtime.context
    prompt = ctx.rewriter.build(state["question"], (), turns_of(state["history"]))
    out = await ctx.engine.generate(prompt.answer, max_tokens=ctx.config.max_rewrite_tokens, cache_salt=ctx.cache_salt)
    text, spent = out.text.strip(), spent_on(prompt.answer, out)
    reason = rewrite_problem(text, state["question"], state["history"])
    if reason is None:
        return {"standalone": text, "_timing": spent}
    used = joined_question(state["question"], state["history"])
    return {"standalone": used, "_timing": spent,
            "rewrite_fallbacks": [{"node": "contextualize", "rewrite": text, "used": used, "reason": reason}]}


def spent_on(prompt: Sequence[int], out: Any) -> dict:
    """The tokens one generation spent, as a node's timing entry carries them (`TurnResult.usage` sums them)."""
    return {"prompt_tokens": len(prompt), "cached_tokens": out.num_cached_tokens,
            "completion_tokens": len(out.token_ids)}


async def retrieve(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """The store's passages for the standalone question, or for the last rewrite after a search."""
    ctx = runtime.context
    query = state["standalone"] if not state.get("searches") else state["ask"]
    try:
        hits = await asyncio.to_thread(ctx.store.search, query, top_k=ctx.config.top_k)
        passages = [as_passage(h) for h in hits]
    except Exception as exc:  # noqa: BLE001 - any failure ends the turn with its message, never an answer
        return {"queries": [query], "decision": "error",
                "error": f"retrieval failed for {query!r}: {type(exc).__name__}: {exc}"}
    return {"queries": [query], "passages": [asdict(p) for p in passages]}


async def gate(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """The gate's decision on the last retrieval; with `AgentConfig.answer_beside_gate`, the answer is submitted
    just before it and held (`gatehead.agent.held`): released to `generate` on `answer`, else aborted."""
    ctx = runtime.context
    held = None
    if ctx.config.answer_beside_gate:
        prompt = ctx.engine.prompts.build(state["ask"], [as_passage(p) for p in state["passages"]],
                                          turns_of(state["history"]))
        held = ctx.held.start(ctx.engine, prompt.answer, max_tokens=ctx.answer_tokens, cache_salt=ctx.cache_salt,
                              priority=POST_GATE_PRIORITY)
    try:
        result = await gate_decision(ctx.engine, state["ask"], state["passages"], state["history"],
                                     ctx.config.thresholds, ctx.cache_salt)
    except BaseException:
        if held is not None:
            await ctx.held.drop(held)
        raise
    call = {"query": state["ask"], "probs": result["probs"], "decision": result["decision"]}
    # What the engine spent: the gate's prompt (it samples no text), and an answer held beside it and dropped.
    spent = {"prompt_tokens": result["prompt_tokens"], "cached_tokens": result["cached_tokens"], "completion_tokens": 0}
    if held is not None and result["decision"] != "answer":
        call["wasted_answer_tokens"] = await ctx.held.drop(held)
        spent["prompt_tokens"] += len(prompt.answer)
        spent["cached_tokens"] += held.cached_tokens
        spent["completion_tokens"] = call["wasted_answer_tokens"]
    return {"gates": [call], "dropped": result["dropped"], "_timing": spent}


async def generate(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """The answer, streamed to the run's writer: the same builder and inputs as the gate's prompt, so the
    same prefix, read from the prefix cache."""
    ctx = runtime.context
    prompt = ctx.engine.prompts.build(state["ask"], [as_passage(p) for p in state["passages"]],
                                      turns_of(state["history"]))
    started, first, text, cached, tokens, finish = time.perf_counter(), None, "", 0, 0, None
    held = ctx.held.take(prompt.answer, max_tokens=ctx.answer_tokens, cache_salt=ctx.cache_salt)
    stream = held.release() if held is not None else ctx.engine.stream(
        prompt.answer, max_tokens=ctx.answer_tokens, cache_salt=ctx.cache_salt, priority=POST_GATE_PRIORITY)
    async with aclosing(stream):
        async for out in stream:
            if out.token_ids and first is None:  # the first token, whether or not it decodes to text yet
                # A held answer's counts from its submission beside the gate, as a fresh one's from its own.
                first = (held.first_token or time.perf_counter()) - held.submitted if held is not None \
                    else time.perf_counter() - started
            if out.text != text:
                runtime.stream_writer({"token": out.text[len(text):]})
                text = out.text
            cached, finish, tokens = out.num_cached_tokens, out.finish_reason, len(out.token_ids)
    answer = text.strip()
    # The reported decision is what the user got: the model may refuse where the gate said answer.
    said = ({"decision": "refuse", "refusal_reason": "generated"} if is_refusal(answer)
            else {"decision": "answer", "grounded": grounded(answer, prompt.passages)})
    return {"answer": answer, **said, "finish_reason": finish or "stop",
            "_timing": {"ttft": round(first or 0.0, 6), "cached_tokens": cached, "completion_tokens": tokens,
                        "prompt_tokens": len(prompt.answer), "held": held is not None}}


async def refusal(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    return {"answer": REFUSAL, "decision": "refuse", "refusal_reason": "gate"}


async def rewrite(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """The question rewritten for another search, from what the last retrieval found; a rewrite that fails its
    check (`rewrite_problem`, which allows the passages' names) gives way to the query it had."""
    ctx = runtime.context
    passages = [as_passage(p) for p in state["passages"]]
    prompt = ctx.rewriter.build(state["ask"], passages, turns_of(state["history"]))
    out = await ctx.engine.generate(prompt.answer, max_tokens=ctx.config.max_rewrite_tokens, cache_salt=ctx.cache_salt,
                                    priority=POST_GATE_PRIORITY)
    text, searches = out.text.strip(), state.get("searches", 0) + 1
    sources = [state["question"], *(f"{p.title}\n{p.text}" for p in passages)]
    reason = rewrite_problem(text, state["ask"], state["history"], sources=sources, keep_names=False)
    if reason is None:
        return {"ask": text, "searches": searches, "_timing": spent_on(prompt.answer, out)}
    return {"ask": state["ask"], "searches": searches, "_timing": spent_on(prompt.answer, out),
            "rewrite_fallbacks": [{"node": "rewrite", "rewrite": text, "used": state["ask"], "reason": reason}]}


async def not_found(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    return {"answer": NOT_FOUND, "decision": "not_found"}


async def finish(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    """The turn joins the thread's history."""
    turns = [{"role": "user", "text": state["question"]}, {"role": "assistant", "text": state["answer"]}]
    return {"history": [*state["history"], *turns]}


async def failed(state: AgentState, runtime: Runtime[AgentContext]) -> dict:
    return {}
