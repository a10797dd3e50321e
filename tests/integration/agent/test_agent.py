"""The agent on the demo model, the shared engine and a real embedded Qdrant index of the demo corpus."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gatehead.agent import Agent, AgentConfig
from gatehead.agent.checkpoint import open_checkpointer
from gatehead.agent.prompts import CLARIFY, NOT_FOUND, REFUSAL
from gatehead.demo.index import open_demo_store
from gatehead.errors import InvalidInput
from gatehead.gate.policy import Thresholds
from gatehead.retrieval.config import StoreConfig
from gatehead.retrieval.store import Store
from gatehead.testing import cited, states

ROOT = Path(__file__).resolve().parents[3]
STRATA = "How much does the Strata Headlamp cost?"
BY_CODE = "What is the price of the GW-960?"  # the notice names the product; the rewrite finds its price
GHOST = "How much does the Mistral Tent cost?"  # no such product
HEADLAMP = "products/strata-headlamp.md"


@pytest.fixture(scope="module")
def store(tmp_path_factory, embedder):
    store = open_demo_store(tmp_path_factory.mktemp("agent") / "qdrant", embedder=embedder)
    yield store
    store.close()


@pytest.fixture(scope="module")
def saver(loop, tmp_path_factory):
    manager = open_checkpointer(tmp_path_factory.mktemp("threads") / "threads.sqlite")
    yield loop.run(manager.__aenter__())
    loop.run(manager.__aexit__(None, None, None))


@pytest.fixture(scope="module")
def agent(demo_shared, store, saver) -> Agent:
    return Agent(demo_shared, store, AgentConfig(), saver)


def nodes(result) -> list[str]:
    return [t["node"] for t in result.timings]


def test_answer_route_reuses_the_gate_prefill(agent, loop) -> None:
    result = loop.run(agent.ask(STRATA))
    assert result.decision == "answer" and states(result.answer, "€64") and not result.error
    assert cited(result.answer, result.sources) == [HEADLAMP] and result.grounded is True
    assert nodes(result) == ["retrieve", "gate", "generate", "finish"]
    assert result.queries == [STRATA] and result.sources[0] == HEADLAMP
    [gate] = result.gates
    assert gate["decision"] == "answer" and math.isclose(sum(gate["probs"].values()), 1.0, abs_tol=1e-3)
    generate = result.timings[2]
    # Everything but the last partial block of the answer prompt came from the gate's prefill.
    assert generate["prompt_tokens"] - 32 < generate["cached_tokens"] <= generate["prompt_tokens"]
    assert 0 < generate["ttft"] <= generate["seconds"] and all(t["seconds"] >= 0 for t in result.timings)
    assert 1 <= generate["completion_tokens"] <= agent.config.max_answer_tokens


def test_an_answer_cut_at_its_budget_says_length_and_the_salt_is_never_checkpointed(agent, saver, loop) -> None:
    result = loop.run(agent.ask(STRATA, "budget", max_answer_tokens=1, cache_salt="tenant-secret-salt"))
    assert result.decision == "answer" and result.finish_reason == "length"
    assert loop.run(agent.ask(STRATA, "budget")).finish_reason == "stop"

    async def stored() -> str:
        return "".join(repr(c) for c in [item async for item in saver.alist({"configurable": {"thread_id": "budget"}})])

    text = loop.run(stored())
    assert "budget" in text and "tenant-secret-salt" not in text
    with pytest.raises(InvalidInput, match="max_answer_tokens"):
        loop.run(agent.ask(STRATA, max_answer_tokens=0))


def test_search_route_rewrites_then_answers(agent, loop) -> None:
    result = loop.run(agent.ask(BY_CODE))
    assert [g["decision"] for g in result.gates] == ["search", "answer"]
    assert result.queries[0] == BY_CODE and "Strata Headlamp" in result.queries[1]  # the notice names it
    assert result.rewrite_fallbacks == []  # the rewrite's product name is the notice's, so its check passes
    assert nodes(result) == ["retrieve", "gate", "rewrite", "retrieve", "gate", "generate", "finish"]
    assert result.decision == "answer" and states(result.answer, "€64")
    assert cited(result.answer, result.sources) == [HEADLAMP]


def test_refuse_route_answers_without_generating(agent, loop) -> None:
    result = loop.run(agent.ask(GHOST))
    assert result.decision == "refuse" and result.answer == REFUSAL
    assert (result.refusal_reason, result.grounded) == ("gate", None)
    assert nodes(result) == ["retrieve", "gate", "refusal", "finish"]
    assert result.gates[0]["probs"]["refuse"] > 0.9


def test_a_first_question_that_points_back_is_asked_back_before_any_engine_work(agent, loop) -> None:
    result = loop.run(agent.ask("And its weight?", "no-referent"))
    assert (result.decision, result.answer, result.grounded) == ("clarify", CLARIFY, None)
    assert nodes(result) == ["clarify", "finish"] and result.gates == [] and result.queries == []


class Counting:
    """The real store, counting searches."""

    def __init__(self, store: Store) -> None:
        self.store, self.queries = store, []

    def search(self, query: str, top_k: int = 3):
        self.queries.append(query)
        return self.store.search(query, top_k=top_k)


@pytest.mark.parametrize("max_searches", [0, 3])
def test_search_loop_is_bounded_and_ends_in_an_honest_refusal(demo_shared, store, loop, max_searches) -> None:
    counting = Counting(store)
    # Thresholds of 1 make every gate call "search" (a gate that never finds the documents enough).
    never_enough = Thresholds(answer=1.0, refuse=1.0) if max_searches else None
    agent = Agent(demo_shared, counting, AgentConfig(max_searches=max_searches, thresholds=never_enough))
    result = loop.run(agent.ask(BY_CODE))
    assert [g["decision"] for g in result.gates] == ["search"] * (max_searches + 1)
    assert result.decision == "not_found" and result.answer == NOT_FOUND
    assert len(counting.queries) == max_searches + 1 and nodes(result)[-2:] == ["not_found", "finish"]


def test_follow_up_is_made_standalone_and_the_thread_persists(agent, loop) -> None:
    first = loop.run(agent.ask(STRATA, "follow-up"))
    second = loop.run(agent.ask("And its warranty?", "follow-up"))
    assert "Strata Headlamp" in second.standalone and "warranty" in second.standalone  # "its", resolved
    assert second.queries == [second.standalone] and nodes(second)[0] == "contextualize"
    assert second.rewrite_fallbacks == []  # the model's own rewrite passed its check
    assert second.decision == "answer" and states(second.answer, "2 years")
    assert cited(second.answer, second.sources) == [HEADLAMP]
    history = loop.run(agent.history("follow-up"))
    assert [(t.role, t.text) for t in history] == [("user", STRATA), ("assistant", first.answer),
                                                   ("user", "And its warranty?"), ("assistant", second.answer)]
    assert loop.run(agent.history("another-thread")) == []


def test_context_budget_drops_the_oldest_turns(agent, loop) -> None:
    thread = "long"
    loop.run(agent.ask(STRATA, thread))
    chatter = " ".join(["The weather at the coast was grey and windy all week long."] * 12)
    long_history = [{"role": role, "text": f"{i}: {chatter}"} for i in range(24) for role in ("user", "assistant")]
    config = agent._config(thread)
    state = loop.run(agent.graph.aget_state(config)).values
    loop.run(agent.graph.aupdate_state(config, {"history": long_history + state["history"]}, as_node="finish"))
    result = loop.run(agent.ask(STRATA, thread))
    dropped = result.dropped["turns"]
    assert dropped and dropped == list(range(len(dropped)))  # the oldest ones, in order
    assert len(dropped) < len(long_history) + 2  # the latest turns stayed
    assert result.decision in ("answer", "refuse", "not_found") and result.answer


def test_a_failing_store_ends_the_turn_with_an_error_and_no_answer(demo_shared, loop, tmp_path, embedder) -> None:
    store = Store(StoreConfig(path=tmp_path / "q", collection="demo"), embedder)
    agent = Agent(demo_shared, store)
    store.close()  # the store is gone: every search raises
    result = loop.run(agent.ask(STRATA, "broken"))
    assert result.decision == "error" and result.answer == "" and not result.gates
    assert result.error.startswith(f"retrieval failed for {STRATA!r}: RuntimeError:")
    assert nodes(result) == ["retrieve", "failed"]
    assert loop.run(agent.history("broken")) == []  # a failed turn is not part of the conversation


def test_stream_yields_node_events_and_answer_tokens(agent, loop) -> None:
    async def collect():
        return [event async for event in agent.stream(STRATA)]

    events = loop.run(collect())
    kinds = [e.kind for e in events]
    assert kinds[-1] == "final" and kinds.count("final") == 1
    assert [e.node for e in events if e.kind == "node"] == ["begin", "retrieve", "gate", "generate", "finish"]
    tokens = "".join(e.text for e in events if e.kind == "token")
    assert tokens.strip() == events[-1].result.answer and states(tokens, "€64")
    assert kinds.index("token") < kinds.index("final")  # tokens arrive before the turn ends
    gate_event = next(e for e in events if e.node == "gate")
    assert gate_event.data["gates"][-1]["decision"] == "answer"


def test_an_answer_beside_the_gate_changes_nothing_the_user_sees(demo_shared, store, loop) -> None:
    """Answer, refuse and search turns, sequential and with the answer submitted beside the gate: the same
    decisions, the same streamed answers, nothing of an aborted answer shown, no request left running."""
    sequential, beside = (Agent(demo_shared, store, AgentConfig(answer_beside_gate=on)) for on in (False, True))

    async def turn(agent: Agent, question: str):
        tokens, result = [], None
        async for event in agent.stream(question):
            if event.kind == "token":
                tokens.append(event.text)
            elif event.kind == "final":
                result = event.result
        return "".join(tokens), result

    for question in (STRATA, GHOST, BY_CODE, "How much does the Vale Lantern weigh?"):
        text, want = loop.run(turn(sequential, question))
        assert loop.run(demo_shared.reset_prefix_cache())  # the beside turn finds none of the sequential one's
        before = loop.run(demo_shared.stats())
        got_text, got = loop.run(turn(beside, question))
        after = loop.run(demo_shared.stats())
        assert (got.decision, got.answer, got_text) == (want.decision, want.answer, text), question
        assert [g["decision"] for g in got.gates] == [g["decision"] for g in want.gates]
        assert demo_shared.unfinished_requests == 0  # every aborted answer is gone from the engine
        # One answer request per gate, each prefilled beside it: the second of the pair reads the first's prefix.
        assert after["generation_requests"] - before["generation_requests"] == len(got.gates) + len(got.queries) - 1
        # Every gate that did not say answer aborted its held answer and counted what it had decoded.
        wasted = [g.get("wasted_answer_tokens") for g in got.gates]
        answered = got.decision == "answer"
        assert [w is None for w in wasted] == [False] * (len(wasted) - answered) + [True] * answered
        assert all(w >= 0 for w in wasted if w is not None)
        released = [t for t in got.timings if t["node"] == "generate"]
        assert [t["held"] for t in released] == [True] * answered
        if answered:  # the answer and its gate prefilled their shared prefix once (whole blocks of 32)
            assert after["prefix_cache_hits"] - before["prefix_cache_hits"] >= released[0]["prompt_tokens"] - 32


def test_answers_beside_their_gates_in_mixed_batches_hold_the_stability_rule(demo_shared, store, loop) -> None:
    """Validation questions of every label, all in flight at once: two sequential passes and one with answers
    beside their gates (prefix cache emptied before each). DESIGN's stability rule: the overlapped pass differs
    from a sequential one in no more turns than the two sequential passes differ (none where they are
    identical); a turn's decisions and answer count."""
    from gatehead.demo.splits import held_out_examples

    examples = held_out_examples(("val",))
    questions = [e.question for label in ("answer", "refuse", "search")
                 for e in [x for x in examples if x.label == label][:6]]

    async def one_pass(agent: Agent) -> list[tuple]:
        assert await demo_shared.reset_prefix_cache()
        results = await asyncio.gather(*(agent.ask(q) for q in questions))
        return [(r.decision, r.answer, tuple(g["decision"] for g in r.gates)) for r in results]

    sequential = Agent(demo_shared, store, AgentConfig())
    first, second = loop.run(one_pass(sequential)), loop.run(one_pass(sequential))
    beside = loop.run(one_pass(Agent(demo_shared, store, AgentConfig(answer_beside_gate=True))))
    repeat_differences = sum(a != b for a, b in zip(first, second, strict=True))
    differences = [(q, a, b) for q, a, b in zip(questions, first, beside, strict=True) if a != b]
    print(f"sequential vs sequential: {repeat_differences} of {len(questions)} turns differ; "
          f"beside vs sequential: {len(differences)}")
    assert len(differences) <= repeat_differences, differences
    assert {d for d, _, _ in beside} >= {"answer", "refuse"}  # both paths ran: released and aborted answers
    assert demo_shared.unfinished_requests == 0


def test_bad_input_is_refused(agent, loop) -> None:
    with pytest.raises(ValueError, match="empty"):
        loop.run(agent.ask("   "))
    with pytest.raises(ValueError, match="max_searches"):
        AgentConfig(max_searches=-1)


def test_postgres_url_failure_names_the_server_without_the_password(loop) -> None:
    async def attempt():
        async with open_checkpointer("postgresql://user:s3cret@127.0.0.1:9/threads"):
            pass

    with pytest.raises(ConnectionError) as info:
        loop.run(attempt())
    assert "127.0.0.1:9" in str(info.value) and "s3cret" not in str(info.value)


def test_threads_persist_in_postgres(demo_shared, store, loop, tmp_path) -> None:
    import pgserver  # a real PostgreSQL server, pip-installed (dev extra)

    server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    try:
        url = server.get_uri()
        assert url.startswith("postgresql://")

        async def turn(question: str):
            async with open_checkpointer(url) as saver:  # a fresh connection and Agent each time
                return await Agent(demo_shared, store, checkpointer=saver).ask(question, "pg-thread")

        first = loop.run(turn(STRATA))
        second = loop.run(turn("And its warranty?"))
        assert states(first.answer, "€64") and states(second.answer, "2 years")
        assert "Strata Headlamp" in second.standalone
    finally:
        server.cleanup()


CHILD = textwrap.dedent('''
    import asyncio, json, os, signal, sys
    from gatehead.agent import Agent
    from gatehead.agent.checkpoint import open_checkpointer
    from gatehead.demo.index import open_demo_store
    from gatehead.runtime.engine import EngineConfig, SharedEngine
    from gatehead.testing import demo_kit

    class Counting:
        """The real engine, counting calls; with crash=True it kills this process when the answer starts."""
        def __init__(self, engine, crash):
            self.engine, self.crash, self.calls = engine, crash, []
        def __getattr__(self, name):
            return getattr(self.engine, name)
        async def gate(self, *args, **kwargs):
            self.calls.append("gate")
            return await self.engine.gate(*args, **kwargs)
        async def generate(self, *args, **kwargs):
            self.calls.append("generate")
            return await self.engine.generate(*args, **kwargs)
        def stream(self, *args, **kwargs):
            self.calls.append("stream")
            if self.crash:
                print("crashing", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            return self.engine.stream(*args, **kwargs)

    async def main(mode, engine, store):
        async with open_checkpointer(sys.argv[3]) as saver:
            agent = Agent(engine, store, checkpointer=saver)
            if mode == "crash":
                await agent.ask(sys.argv[4], "crashy")
                return None
            result = await agent.resume("crashy")
            return result.to_dict()

    if __name__ == "__main__":
        mode = sys.argv[1]
        store = open_demo_store(sys.argv[2])
        model, adapter, _ = demo_kit()
        engine = Counting(SharedEngine(EngineConfig(model=model, adapter=adapter, enforce_eager=True,
                                                    memory_fraction=0.1, block_size=32, max_model_len=2048)),
                          crash=mode == "crash")
        try:
            result = asyncio.run(main(mode, engine, store))
            print("RESULT " + json.dumps({"result": result, "calls": engine.calls}, default=str), flush=True)
        finally:
            engine.shutdown()
            store.close()
''')


def run_child(script: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the child script in its own session; its output goes to files (the engine's processes hold pipes)."""
    out_path, err_path = script.with_suffix(".out"), script.with_suffix(".err")
    with out_path.open("w") as out, err_path.open("w") as err:
        child = subprocess.Popen([sys.executable, str(script), *args], stdout=out, stderr=err, text=True,
                                 start_new_session=True, cwd=script.parent)
        try:
            child.wait(timeout=400)
        finally:
            try:  # the engine's own processes, orphaned when the child is killed
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out_path.read_text(), err_path.read_text())


def test_a_crashed_turn_resumes_from_its_checkpoint_without_redoing_nodes(agent, loop, tmp_path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    store_dir, threads = str(tmp_path / "qdrant"), str(tmp_path / "threads.sqlite")
    crashed = run_child(script, "crash", store_dir, threads, BY_CODE)
    assert crashed.returncode == -signal.SIGKILL and "crashing" in crashed.stdout, crashed.stderr[-3000:]
    resumed = run_child(script, "resume", store_dir, threads)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    payload = json.loads(re.search(r"^RESULT (.*)$", resumed.stdout, re.M).group(1))
    # Retrieval, both gate calls and the rewrite were done before the crash: only the answer is left.
    assert payload["calls"] == ["stream"]
    after = payload["result"]
    uninterrupted = loop.run(agent.ask(BY_CODE)).to_dict()
    for key in ("decision", "answer", "queries", "sources", "standalone", "dropped"):
        assert after[key] == uninterrupted[key], key
    assert [g["decision"] for g in after["gates"]] == [g["decision"] for g in uninterrupted["gates"]]
    for ours, theirs in zip(after["gates"], uninterrupted["gates"], strict=True):
        assert all(abs(ours["probs"][k] - theirs["probs"][k]) < 0.02 for k in ours["probs"])
    assert [t["node"] for t in after["timings"]] == [t["node"] for t in uninterrupted["timings"]]
