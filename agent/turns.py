"""`Agent`: turns on threads over the compiled graph, streamed, checkpointed and resumable."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from gatehead.agent.context import AgentContext, Engine, Retriever
from gatehead.agent.graph import agent_context, build_graph
from gatehead.agent.held import HeldAnswers
from gatehead.agent.state import AgentConfig, AgentEvent, TurnResult, turns_of
from gatehead.errors import InvalidInput
from gatehead.gate.prompt import Turn
from gatehead.runtime.affinity import turn_key


class Agent:
    """Threads over the compiled graph: `ask`, `stream`, `resume`, `history`.

    A turn's state is checkpointed after every node (durability "sync"), so a turn cut short by a
    crash is finished by `resume` (or by the thread's next `ask`) without redoing finished nodes; the
    same question asked again is that turn's retry and finishes it instead of starting another.
    """

    def __init__(self, engine: Engine, store: Retriever, config: AgentConfig | None = None,
                 checkpointer=None) -> None:
        """`checkpointer`: where threads persist (`gatehead.agent.checkpoint.open_checkpointer`); default
        in memory, for this process only."""
        from langgraph.checkpoint.memory import InMemorySaver

        self.engine, self.store, self.config = engine, store, config or AgentConfig()
        self.context = agent_context(engine, store, self.config)
        self.graph = build_graph(checkpointer or InMemorySaver())

    def _context(self, cache_salt: str | None, max_answer_tokens: int | None = None) -> AgentContext:
        return replace(self.context, cache_salt=cache_salt, max_answer_tokens=max_answer_tokens, held=HeldAnswers())

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
            raise InvalidInput("the question is empty")
        if max_answer_tokens is not None and not 1 <= max_answer_tokens <= self.engine.prompts.answer_tokens:
            raise InvalidInput(f"max_answer_tokens must be in [1, {self.engine.prompts.answer_tokens}] (the answer's "
                               f"room in the prompt layout), got {max_answer_tokens}")
        thread_id = thread_id or uuid.uuid4().hex
        context = self._context(cache_salt, max_answer_tokens)
        pending = await self.graph.aget_state(self._config(thread_id))
        if pending.next:  # an interrupted turn (its process died) is finished first
            # Asked again, it is a retry (a client or load balancer resending to another replica):
            # finishing it is this turn, not a second one.
            retry = history is None and pending.values.get("question") == question
            async for event in self._run(None, thread_id, context if retry else self._context(cache_salt)):
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
                   context: AgentContext) -> AsyncIterator[AgentEvent]:
        state: dict = {}
        try:
            # Where the engine has several servers, the turn's requests all go to the one its thread hashes to.
            context = replace(context, affinity=turn_key(context.cache_salt, thread_id))
            async for mode, chunk in self.graph.astream(graph_input, self._config(thread_id), context=context,
                                                        stream_mode=["updates", "custom", "values"],
                                                        durability="sync"):
                if mode == "custom" and "token" in chunk:
                    yield AgentEvent("token", text=chunk["token"])
                elif mode == "updates":
                    for node, update in chunk.items():
                        yield AgentEvent("node", node=node, data=dict(update or {}))
                elif mode == "values":
                    state = chunk
        finally:  # a run cut short between its gate and its answer leaves no answer running
            await context.held.abort_all()
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
        async for event in self._run(None, thread_id, self._context(cache_salt)):
            if event.kind == "final":
                result = event.result
        return result

    async def history(self, thread_id: str) -> list[Turn]:
        """The thread's finished turns."""
        return turns_of((await self.graph.aget_state(self._config(thread_id))).values.get("history") or [])
