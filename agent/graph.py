"""The agent as a LangGraph graph over one shared engine and one retrieval store.

    begin -> [contextualize] -> retrieve -> gate -+-> generate ----------------> finish
                                   ^              +-> refusal -----------------> finish
                                   |              +-> rewrite (searches left) -> retrieve
                                   |              +-> not_found (none left) ----> finish
                                   +-- retrieve fails -> failed (the turn ends with the error, no answer)

`contextualize` runs on follow-up turns only: it makes the question standalone for retrieval. The
gate, the query rewrite and the answer all run on the one `SharedEngine` passed in; the answer's
prompt is the gate prompt's prefix (same layout, same budget), so it reuses the gate's prefill. The
graph persists through any LangGraph checkpointer (`gatehead.agent.checkpoint`); `Agent` wraps it
with threads, streaming and resumption. Nodes never build engines or stores.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Protocol, TypedDict

from gatehead.agent.prompts import NOT_FOUND, REFUSAL, REWRITE_SYSTEM
from gatehead.gate.policy import Thresholds
from gatehead.gate.prompt import Passage, PromptBuilder, PromptConfig, Turn


class Retriever(Protocol):
    """What the agent retrieves with: `gatehead.retrieval.store.Store`, or anything with this method."""

    def search(self, query: str, top_k: int = ...) -> Sequence[Any]: ...


@dataclass(frozen=True)
class AgentConfig:
    """How the agent runs a turn."""

    top_k: int = 3  # passages per retrieval (the demo model was trained on 3)
    max_searches: int = 2  # query rewrites per turn before it gives up with NOT_FOUND
    max_answer_tokens: int = 128
    max_rewrite_tokens: int = 48
    thresholds: Thresholds | None = None  # default: the adapter's calibrated ones

    def __post_init__(self) -> None:
        for name in ("top_k", "max_answer_tokens", "max_rewrite_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_searches < 0:
            raise ValueError(f"AgentConfig.max_searches must be >= 0, got {self.max_searches}")


def _log(old: list | None, new: list | None) -> list:
    """Reducer of the per-turn logs: appends; None starts the log afresh (at the start of a turn)."""
    return [] if new is None else [*(old or []), *new]


class AgentState(TypedDict, total=False):
    """The graph's state. `question` is the input; `history` persists across the thread's turns."""

    question: str  # the user's message this turn
    history: list[dict]  # earlier turns of the thread: {"role": "user" | "assistant", "text": ...}
    standalone: str  # the question made standalone for retrieval (the question itself on a first turn)
    ask: str  # what the gate and the answer are asked: the question, or the last rewrite after a search
    queries: Annotated[list[str], _log]  # every retrieval query of the turn
    passages: list[dict]  # the last retrieval's passages (text, title, source, score)
    gates: Annotated[list[dict], _log]  # every gate call: query, probs, decision
    searches: int  # rewrites done this turn
    decision: str  # answer | refuse | not_found | error
    answer: str
    finish_reason: str  # why the answer ended: "stop", or "length" at the token budget
    dropped: dict  # what the context budget left out of the last gate prompt: turns, passage sources
    timings: Annotated[list[dict], _log]  # per node run: node, seconds (+ ttft, cached and answer tokens for generate)
    error: str


def as_passage(item: Any) -> Passage:
    """A passage from a retrieval result: `Passage`, a store `Hit`, a LangChain `Document`, a dict or a string."""
    if isinstance(item, Passage):
        return item
    if isinstance(item, str):
        return Passage(text=item)
    if hasattr(item, "to_passage"):
        return item.to_passage()
    if hasattr(item, "page_content"):  # langchain_core.documents.Document
        meta = dict(getattr(item, "metadata", None) or {})
        return Passage(text=item.page_content, title=str(meta.get("title", "")), source=str(meta.get("source", "")),
                       score=float(meta.get("score", 0.0)))
    if isinstance(item, dict) and "text" in item:
        return Passage(text=str(item["text"]), title=str(item.get("title", "")), source=str(item.get("source", "")),
                       score=float(item.get("score", 0.0)))
    raise TypeError(f"cannot use {type(item).__name__} as a passage: give a Passage, a Hit, a Document, a dict "
                    f"with 'text', or a string")


def _turns(history: Sequence[dict]) -> list[Turn]:
    return [Turn(t["role"], t["text"]) for t in history]


async def gate_decision(engine, question: str, passages: Sequence[Any], conversation: Sequence[Any] = (),
                        thresholds: Thresholds | None = None, cache_salt: str | None = None) -> dict:
    """Gate `question` over `passages` on the shared engine.

    Returns {"decision", "probs", "thresholds", "prompt_tokens", "dropped", "prompt"}; `dropped` names
    what the context budget left out (turn indices, passage sources or indices).
    The building block of the agent's gate node and of `gate_node` for graphs of your own.
    """
    kept = [as_passage(p) for p in passages]
    turns = [t if isinstance(t, Turn) else Turn(t["role"], t["text"]) for t in conversation]
    outcome = await engine.gate(question, kept, turns, thresholds=thresholds, cache_salt=cache_salt)
    prompt = outcome.prompt
    return {"decision": outcome.result.decision, "probs": dict(outcome.result.probs),
            "thresholds": outcome.result.thresholds.to_dict(), "prompt_tokens": outcome.num_prompt_tokens,
            "dropped": {"turns": list(prompt.dropped.turns),
                        "passages": [kept[i].source or str(i) for i in prompt.dropped.passages]},
            "prompt": prompt}


def gate_node(engine, *, question_key: str = "question", passages_key: str = "passages",
              conversation_key: str | None = None, output_key: str = "gate",
              thresholds: Thresholds | None = None) -> Callable[[dict], Any]:
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


def route_on_gate(output_key: str = "gate") -> Callable[[dict], str]:
    """A conditional-edge function: the gate's decision ("answer", "refuse" or "search")."""
    return lambda state: state[output_key]["decision"]


@dataclass(frozen=True)
class TurnContext:
    """Per-run settings passed as LangGraph's run context: never written to a checkpoint."""

    cache_salt: str | None = None  # keeps the turn's prefix-cache blocks to its tenant
    max_answer_tokens: int | None = None  # this turn's answer budget; default AgentConfig.max_answer_tokens


def _context() -> TurnContext:
    from langgraph.runtime import get_runtime

    return get_runtime(TurnContext).context or TurnContext()


def _salt() -> str | None:
    return _context().cache_salt


def _timed(name: str, fn: Callable[[AgentState], Any]) -> Callable[[AgentState], Any]:
    async def node(state: AgentState) -> dict:
        started = time.perf_counter()
        update = await fn(state)
        entry = {"node": name, "seconds": round(time.perf_counter() - started, 6), **update.pop("_timing", {})}
        return {**update, "timings": [entry]}

    node.__name__ = name
    return node


def build_graph(engine, store: Retriever, config: AgentConfig = AgentConfig(), checkpointer=None):
    """The compiled agent graph over `engine` (a `SharedEngine` with a gate adapter) and `store`."""
    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph

    if engine.prompts is None:
        raise ValueError("the agent needs an engine started with a gate adapter (EngineConfig.adapter)")
    window = engine.prompts.max_context
    rewriter = PromptBuilder(engine.tokenizer, engine.adapter.spec.suffix,
                             PromptConfig(max_context=window, system=REWRITE_SYSTEM))

    async def begin(state: AgentState) -> dict:
        question = state.get("question", "")
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question is empty")
        return {"queries": None, "gates": None, "timings": None, "searches": 0, "decision": "", "answer": "",
                "finish_reason": "stop", "error": "", "passages": [], "dropped": {}, "standalone": question,
                "ask": question, "history": state.get("history") or []}

    async def contextualize(state: AgentState) -> dict:
        prompt = rewriter.build(state["question"], (), _turns(state["history"]))
        out = await engine.generate(prompt.answer, max_tokens=config.max_rewrite_tokens, cache_salt=_salt())
        return {"standalone": out.text.strip() or state["question"]}

    async def retrieve(state: AgentState) -> dict:
        query = state["standalone"] if not state.get("searches") else state["ask"]
        try:
            hits = await asyncio.to_thread(store.search, query, top_k=config.top_k)
            passages = [as_passage(h) for h in hits]
        except Exception as exc:  # noqa: BLE001 - any failure ends the turn with its message, never an answer
            return {"queries": [query], "decision": "error",
                    "error": f"retrieval failed for {query!r}: {type(exc).__name__}: {exc}"}
        return {"queries": [query], "passages": [asdict(p) for p in passages]}

    async def gate(state: AgentState) -> dict:
        result = await gate_decision(engine, state["ask"], state["passages"], state["history"], config.thresholds,
                                     _salt())
        call = {"query": state["ask"], "probs": result["probs"], "decision": result["decision"]}
        return {"gates": [call], "dropped": result["dropped"]}

    async def generate(state: AgentState) -> dict:
        # The same builder and inputs as the gate's prompt: the same prefix, read from the prefix cache.
        prompt = engine.prompts.build(state["ask"], [as_passage(p) for p in state["passages"]],
                                      _turns(state["history"]))
        writer = get_stream_writer()
        started, first, text, cached, tokens = time.perf_counter(), None, "", 0, 0
        context, finish = _context(), None
        async for out in engine.stream(prompt.answer, max_tokens=context.max_answer_tokens or config.max_answer_tokens,
                                       cache_salt=context.cache_salt):
            if out.token_ids and first is None:  # the first token, whether or not it decodes to text yet
                first = time.perf_counter() - started
            if out.text != text:
                writer({"token": out.text[len(text):]})
                text = out.text
            cached, finish, tokens = out.num_cached_tokens, out.finish_reason, len(out.token_ids)
        return {"answer": text.strip(), "decision": "answer", "finish_reason": finish or "stop",
                "_timing": {"ttft": round(first or 0.0, 6), "cached_tokens": cached, "answer_tokens": tokens,
                            "prompt_tokens": len(prompt.answer)}}

    async def refusal(state: AgentState) -> dict:
        return {"answer": REFUSAL, "decision": "refuse"}

    async def rewrite(state: AgentState) -> dict:
        prompt = rewriter.build(state["ask"], [as_passage(p) for p in state["passages"]], _turns(state["history"]))
        out = await engine.generate(prompt.answer, max_tokens=config.max_rewrite_tokens, cache_salt=_salt())
        return {"ask": out.text.strip() or state["ask"], "searches": state.get("searches", 0) + 1}

    async def not_found(state: AgentState) -> dict:
        return {"answer": NOT_FOUND, "decision": "not_found"}

    async def finish(state: AgentState) -> dict:
        turns = [{"role": "user", "text": state["question"]}, {"role": "assistant", "text": state["answer"]}]
        return {"history": [*state["history"], *turns]}

    async def failed(state: AgentState) -> dict:
        return {}

    def after_gate(state: AgentState) -> str:
        decision = state["gates"][-1]["decision"]
        if decision == "answer":
            return "generate"
        if decision == "refuse":
            return "refusal"
        return "rewrite" if state.get("searches", 0) < config.max_searches else "not_found"

    graph = StateGraph(AgentState, context_schema=TurnContext)
    for name, fn in (("begin", begin), ("contextualize", contextualize), ("retrieve", retrieve), ("gate", gate),
                     ("generate", generate), ("refusal", refusal), ("rewrite", rewrite), ("not_found", not_found),
                     ("finish", finish), ("failed", failed)):
        graph.add_node(name, _timed(name, fn) if name != "begin" else fn)
    graph.add_edge(START, "begin")
    graph.add_conditional_edges("begin", lambda s: "contextualize" if s["history"] else "retrieve",
                                ["contextualize", "retrieve"])
    graph.add_edge("contextualize", "retrieve")
    graph.add_conditional_edges("retrieve", lambda s: "failed" if s.get("error") else "gate", ["failed", "gate"])
    graph.add_conditional_edges("gate", after_gate, ["generate", "refusal", "rewrite", "not_found"])
    graph.add_edge("rewrite", "retrieve")
    for name in ("generate", "refusal", "not_found"):
        graph.add_edge(name, "finish")
    graph.add_edge("finish", END)
    graph.add_edge("failed", END)
    return graph.compile(checkpointer=checkpointer)


@dataclass(frozen=True)
class TurnResult:
    """What one turn did and said."""

    thread_id: str
    question: str
    standalone: str  # the question made standalone for retrieval
    decision: str  # answer | refuse | not_found | error
    answer: str  # empty when the turn failed
    gates: list[dict]  # every gate call: query, probs {answer, refuse, search}, decision
    queries: list[str]  # every retrieval query
    passages: list[Passage]  # those the last gate and the answer saw, in prompt order
    dropped: dict  # what the context budget left out of the last gate prompt: turn indices, passage sources
    timings: list[dict]  # per node run, in order: node, seconds (+ ttft, cached_tokens, answer_tokens for generate)
    error: str = ""
    finish_reason: str = "stop"  # "length" when the answer stopped at its token budget

    @property
    def sources(self) -> list[str]:
        return [p.source for p in self.passages]

    @property
    def probs(self) -> dict[str, float]:
        """The last gate call's probabilities."""
        return self.gates[-1]["probs"] if self.gates else {}

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sources"] = self.sources
        return out

    @classmethod
    def from_state(cls, thread_id: str, state: dict) -> TurnResult:
        passages = [as_passage(p) for p in state.get("passages") or []]
        return cls(thread_id=thread_id, question=state.get("question", ""), standalone=state.get("standalone", ""),
                   decision=state.get("decision", ""), answer=state.get("answer", ""),
                   gates=list(state.get("gates") or []), queries=list(state.get("queries") or []),
                   passages=passages, dropped=dict(state.get("dropped") or {}),
                   timings=list(state.get("timings") or []), error=state.get("error", ""),
                   finish_reason=state.get("finish_reason") or "stop")


@dataclass(frozen=True)
class AgentEvent:
    """One streamed event: `node` (a node finished; `data` is its update), `token` (answer text) or `final`."""

    kind: str
    node: str = ""
    text: str = ""
    data: dict = field(default_factory=dict)
    result: TurnResult | None = None


class Agent:
    """Threads over the compiled graph: `ask`, `stream`, `resume`, `history`.

    A turn's state is checkpointed after every node (durability "sync"), so a turn cut short by a
    crash is finished by `resume` (or by the thread's next `ask`) without redoing finished nodes; the
    same question asked again is that turn's retry and finishes it instead of starting another.
    """

    def __init__(self, engine, store: Retriever, config: AgentConfig = AgentConfig(), checkpointer=None) -> None:
        """`checkpointer`: where threads persist (`gatehead.agent.checkpoint.open_checkpointer`); default
        in memory, for this process only."""
        from langgraph.checkpoint.memory import InMemorySaver

        self.engine, self.store, self.config = engine, store, config
        self.graph = build_graph(engine, store, config, checkpointer or InMemorySaver())

    def _config(self, thread_id: str) -> dict:
        return {"configurable": {"thread_id": thread_id}, "recursion_limit": 8 + 4 * self.config.max_searches}

    async def _result(self, thread_id: str, fallback: dict) -> TurnResult:
        state = (await self.graph.aget_state(self._config(thread_id))).values
        return TurnResult.from_state(thread_id, state or fallback or {})

    async def stream(self, question: str, thread_id: str | None = None, *, history: Sequence[Turn] | None = None,
                     cache_salt: str | None = None, max_answer_tokens: int | None = None) -> AsyncIterator[AgentEvent]:
        """Run one turn, yielding node events and answer tokens as they come, then the `final` event.

        `history` replaces the thread's earlier turns (a caller that keeps the conversation itself, as
        the OpenAI API does); `cache_salt` keeps the turn's prefix-cache blocks to its tenant;
        `max_answer_tokens` overrides the config's answer budget for this turn. Neither is checkpointed.
        """
        if not isinstance(question, str) or not question.strip():
            raise ValueError("the question is empty")
        if max_answer_tokens is not None and max_answer_tokens < 1:
            raise ValueError(f"max_answer_tokens must be >= 1, got {max_answer_tokens}")
        thread_id = thread_id or uuid.uuid4().hex
        context = TurnContext(cache_salt, max_answer_tokens)
        pending = await self.graph.aget_state(self._config(thread_id))
        if pending.next:  # an interrupted turn (its process died) is finished first
            # Asked again, it is a retry (a client or load balancer resending to another replica):
            # finishing it is this turn, not a second one.
            retry = history is None and pending.values.get("question") == question
            async for event in self._run(None, thread_id, context if retry else TurnContext(cache_salt)):
                if retry or event.kind not in ("final", "token"):  # else its answer is not this turn's
                    yield event
            if retry:
                return
        graph_input: dict = {"question": question}
        if history is not None:
            graph_input["history"] = [{"role": t.role, "text": t.text} for t in history]
        async for event in self._run(graph_input, thread_id, context):
            yield event

    async def _run(self, graph_input: dict | None, thread_id: str,
                   context: TurnContext | None = None) -> AsyncIterator[AgentEvent]:
        state: dict = {}
        async for mode, chunk in self.graph.astream(graph_input, self._config(thread_id), context=context,
                                                    stream_mode=["updates", "custom", "values"], durability="sync"):
            if mode == "custom" and "token" in chunk:
                yield AgentEvent("token", text=chunk["token"])
            elif mode == "updates":
                for node, update in chunk.items():
                    yield AgentEvent("node", node=node, data=dict(update or {}))
            elif mode == "values":
                state = chunk
        yield AgentEvent("final", result=await self._result(thread_id, state))

    async def ask(self, question: str, thread_id: str | None = None, *, history: Sequence[Turn] | None = None,
                  cache_salt: str | None = None, max_answer_tokens: int | None = None) -> TurnResult:
        """Run one turn and return its result (a turn whose retrieval failed has `error` set, no answer)."""
        result = None
        async for event in self.stream(question, thread_id, history=history, cache_salt=cache_salt,
                                       max_answer_tokens=max_answer_tokens):
            if event.kind == "final":
                result = event.result
        assert result is not None
        return result

    async def resume(self, thread_id: str, cache_salt: str | None = None) -> TurnResult | None:
        """Finish the thread's interrupted turn from its last checkpoint; None if nothing was interrupted."""
        if not (await self.graph.aget_state(self._config(thread_id))).next:
            return None
        result = None
        async for event in self._run(None, thread_id, TurnContext(cache_salt)):
            if event.kind == "final":
                result = event.result
        return result

    async def history(self, thread_id: str) -> list[Turn]:
        """The thread's finished turns."""
        return _turns((await self.graph.aget_state(self._config(thread_id))).values.get("history") or [])
