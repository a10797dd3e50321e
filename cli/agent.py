"""The agent's commands: `ask` (one turn), `chat` (a conversation, streaming) and `demo` (the scripted tour)."""

from __future__ import annotations

import argparse
import json
import sys

from gatehead.cli.common import add_agent_arguments, agent_store, agent_thresholds, start_engine
from gatehead.demo import DEMO_QUESTIONS


def _run_agent(args: argparse.Namespace, body) -> int:
    """Open the store, start the engine, open the thread checkpointer, and run `body(agent)` in one event loop."""
    import asyncio

    from gatehead.agent import Agent, AgentConfig
    from gatehead.agent.checkpoint import default_checkpoint_path, open_checkpointer
    from gatehead.retrieval.ingest import open_store

    config = AgentConfig(top_k=args.top_k, max_searches=args.max_searches, max_answer_tokens=args.max_tokens,
                         answer_beside_gate=args.answer_beside_gate, thresholds=agent_thresholds(args))
    where, corpus = agent_store(args)
    store = open_store(where, corpus, log=lambda m: print(m, file=sys.stderr))
    threads = args.threads or str(default_checkpoint_path(where))
    try:
        engine = start_engine(args)
        try:
            async def session() -> int:
                await engine.warm_up()  # the first turn does not pay the engine's first-forward costs
                async with open_checkpointer(threads) as saver:
                    return await body(Agent(engine, store, config, saver))

            return asyncio.run(session())
        finally:
            engine.shutdown()
    finally:
        store.close()


def _ask(args: argparse.Namespace) -> int:
    from gatehead.cli.transcript import format_turn

    async def body(agent) -> int:
        result = await agent.ask(args.question, args.thread)
        print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False) if args.json
              else format_turn(result) + f"\n  thread:     {result.thread_id}")
        return 1 if result.error else 0

    return _run_agent(args, body)


def _chat(args: argparse.Namespace) -> int:
    import asyncio
    import uuid

    thread = args.thread or uuid.uuid4().hex

    async def body(agent) -> int:
        print(f"thread {thread} (continue it later with --thread {thread}); an empty line or Ctrl-D ends")
        for turn in await agent.history(thread):
            print(f"{'you' if turn.role == 'user' else 'gatehead'}> {turn.text}")
        while True:
            try:
                question = (await asyncio.to_thread(input, "you> ")).strip()
            except EOFError:
                print()
                return 0
            if not question:
                return 0
            async for event in agent.stream(question, thread):
                _print_chat_event(event)

    return _run_agent(args, body)


def _print_chat_event(event) -> None:
    """Gate calls and searches as notes, the answer as it streams, then its sources (or the error)."""
    if event.kind == "node" and event.data.get("rewrite_fallbacks"):  # a model rewrite its check turned down
        fallback = event.data["rewrite_fallbacks"][-1]
        print(f"  [rewrite {fallback['rewrite']!r} not used: {fallback['reason']}]", flush=True)
    if event.kind == "node" and event.node == "gate":
        gate = event.data["gates"][-1]
        probs = " ".join(f"{k}={v:.2f}" for k, v in gate["probs"].items())
        print(f"  [gate: {gate['decision']} ({probs})]", flush=True)
        if gate["decision"] == "answer":
            print("gatehead> ", end="", flush=True)
    elif event.kind == "node" and event.node == "rewrite":
        print(f"  [searching again: {event.data['ask']}]", flush=True)
    elif event.kind == "node" and event.node == "contextualize":
        print(f"  [standalone: {event.data['standalone']}]", flush=True)
    elif event.kind == "token":
        print(event.text, end="", flush=True)
    elif event.kind == "final":
        result = event.result
        if result.error:
            print(f"error: {result.error}")
        elif not result.generated:  # a refusal, NOT_FOUND or a question back: said, not streamed
            print(f"gatehead> {result.answer}")
        elif result.decision == "refuse":  # the model refused where the gate said answer
            print("\n  [refused by the model]")
        else:
            grounding = "" if result.grounded else "; not grounded in the cited passage"
            print(f"\n  [sources: {', '.join(result.sources)}{grounding}]")


def _demo(args: argparse.Namespace) -> int:
    import uuid

    from gatehead.cli.transcript import format_turn, summary_table

    script = [(f"q{i}", q) for i, q in enumerate(args.question)] if args.question else list(DEMO_QUESTIONS)
    run = uuid.uuid4().hex[:8]  # this run's threads

    async def body(agent) -> int:
        results = []
        for thread, question in script:
            result = await agent.ask(question, f"demo-{run}-{thread}")
            print("\n" + format_turn(result))
            results.append(result)
        print("\n" + summary_table(results))
        return 1 if any(r.error for r in results) else 0

    print("Starting one vLLM engine for the gate, the query rewrites and the answers (eager mode)...")
    return _run_agent(args, body)


def add_parsers(commands) -> None:
    p = commands.add_parser("ask", help="one agent turn: retrieve, gate, then answer, refuse or search again")
    p.add_argument("question")
    p.add_argument("--thread", help="continue this thread (default: a new one)")
    p.add_argument("--json", action="store_true", help="print the turn's full result as JSON")
    add_agent_arguments(p)
    p.set_defaults(func=_ask)

    p = commands.add_parser("chat", help="an interactive multi-turn conversation with the agent")
    p.add_argument("--thread", help="continue this thread (default: a new one)")
    add_agent_arguments(p)
    p.set_defaults(func=_chat)

    p = commands.add_parser("demo", help="run the agent over scripted demo questions: transcript and summary")
    p.add_argument("question", nargs="*", help="questions to ask instead, one thread each")
    add_agent_arguments(p)
    p.set_defaults(func=_demo)
