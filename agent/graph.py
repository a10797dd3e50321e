"""The agent as a LangGraph graph: wiring and routing only (the nodes are `gatehead.agent.nodes`).

    begin -> [contextualize] -> retrieve -> gate -+-> generate ----------------> finish
      |                            ^              +-> refusal -----------------> finish
      |                            |              +-> rewrite (searches left) -> retrieve
      |                            |              +-> not_found (none left) ----> finish
      |                            +-- retrieve fails -> failed (the turn ends with the error, no answer)
      +-> clarify (a first question pointing back at nothing) -----------------> finish

`contextualize` runs on follow-up turns only: it makes the question standalone for retrieval. A
thread's first question that points back ("And its weight?") is asked back (`clarify`). The graph
persists through any LangGraph checkpointer (`gatehead.agent.checkpoint`); every run passes an
`AgentContext` (`context=`), which `Agent` (`gatehead.agent.turns`) builds with threads, streaming and
resumption around it.
"""

from __future__ import annotations

from typing import Literal

from langgraph.runtime import Runtime

from gatehead.agent import nodes
from gatehead.agent.context import AgentContext, Engine
from gatehead.agent.prompts import REWRITE_SYSTEM
from gatehead.agent.rewrites import refers_back
from gatehead.agent.state import AgentConfig, AgentState
from gatehead.gate.prompt import PromptBuilder, PromptConfig


def after_begin(state: AgentState) -> Literal["clarify", "contextualize", "retrieve"]:
    """A follow-up is made standalone first; a thread's first question goes to retrieval as it is, unless it
    points back at something never said: then it is asked back."""
    if state["history"]:
        return "contextualize"
    return "clarify" if refers_back(state["question"]) else "retrieve"


def after_retrieve(state: AgentState) -> Literal["failed", "gate"]:
    return "failed" if state.get("error") else "gate"


def after_gate(state: AgentState, runtime: Runtime[AgentContext]) -> Literal["generate", "refusal", "rewrite",
                                                                               "not_found"]:
    """The gate's decision: answer, refuse, or search again while searches are left."""
    decision = state["gates"][-1]["decision"]
    if decision == "answer":
        return "generate"
    if decision == "refuse":
        return "refusal"
    return "rewrite" if state.get("searches", 0) < runtime.context.config.max_searches else "not_found"


def build_graph(checkpointer=None):
    """The compiled agent graph; run it with `context=agent_context(engine, store, config)`."""
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(AgentState, context_schema=AgentContext)
    graph.add_node("begin", nodes.begin)
    for name in ("clarify", "contextualize", "retrieve", "gate", "generate", "refusal", "rewrite", "not_found",
                 "finish", "failed"):
        graph.add_node(name, nodes.timed(name, getattr(nodes, name)))
    graph.add_edge(START, "begin")
    graph.add_conditional_edges("begin", after_begin, ["clarify", "contextualize", "retrieve"])
    graph.add_edge("contextualize", "retrieve")
    graph.add_conditional_edges("retrieve", after_retrieve, ["failed", "gate"])
    graph.add_conditional_edges("gate", after_gate, ["generate", "refusal", "rewrite", "not_found"])
    graph.add_edge("rewrite", "retrieve")
    for name in ("clarify", "generate", "refusal", "not_found"):
        graph.add_edge(name, "finish")
    graph.add_edge("finish", END)
    graph.add_edge("failed", END)
    return graph.compile(checkpointer=checkpointer)


def agent_context(engine: Engine, store, config: AgentConfig | None = None, cache_salt: str | None = None,
                  max_answer_tokens: int | None = None) -> AgentContext:
    """The run context for `engine` (which needs a gate adapter) and `store` (default settings: `AgentConfig()`)."""
    if engine.prompts is None:
        raise ValueError("the agent needs an engine started with a gate adapter (EngineConfig.adapter)")
    budget = engine.prompts.answer_tokens
    for name, value in (("max_answer_tokens", (config or AgentConfig()).max_answer_tokens),
                        ("the turn's max_answer_tokens", max_answer_tokens)):
        if value is not None and value > budget:
            raise ValueError(f"{name} ({value}) exceeds the {budget} tokens the prompt layout keeps for the answer "
                             f"(PromptConfig.answer_tokens): a prompt that fills its window would overflow it")
    rewriter = PromptBuilder(engine.tokenizer, engine.adapter.spec.suffix,
                             PromptConfig(max_context=engine.prompts.max_context, system=REWRITE_SYSTEM))
    return AgentContext(engine, store, config or AgentConfig(), rewriter, cache_salt, max_answer_tokens)
