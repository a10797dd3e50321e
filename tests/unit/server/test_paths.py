"""The service's error paths and admission on the scripted engine: no vLLM, no Qdrant, in-process ASGI, seconds.

The app is the real one (`create_app`); only its backends are scripted (`Services` takes an opener):
`gatehead.testing.ScriptedEngine` and `ScriptedStore`, and LangGraph's in-memory checkpointer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re

import httpx
import pytest
from langgraph.checkpoint.memory import InMemorySaver

from gatehead.agent import Engine
from gatehead.errors import InvalidInput
from gatehead.runtime.canary import CanaryConfig
from gatehead.runtime.engine import EngineConfig
from gatehead.runtime.guard import GuardedEngine
from gatehead.server.app import create_app
from gatehead.server.config import ServerConfig
from gatehead.server.services import Backends
from gatehead.testing import ScriptedStore

KEY, OTHER = "key-one", "key-two"
GATE = {"question": "How long is the warranty?", "documents": ["The warranty lasts two years."]}


def opener_of(engine, store=None, ready: asyncio.Event | None = None, fail: BaseException | None = None):
    async def opener(config, stack):
        if ready is not None:
            await ready.wait()
        if fail is not None:
            raise fail
        return Backends(engine, store or ScriptedStore(), InMemorySaver())
    return opener


@pytest.fixture
def service(tiny):
    """`async with service(engine, **settings) as (client, services)`: the app on scripted backends, ready;
    then the engine's calls are cleared and its `fail` and `hold` set (the engine's warm-up has run)."""
    @contextlib.asynccontextmanager
    async def start(engine, opener=None, wait=True, fail=None, hold=None, **settings):
        config = ServerConfig(engine=EngineConfig(model=tiny.model_dir, adapter=tiny.adapter_dir),
                              api_keys=(KEY, OTHER), canary=CanaryConfig(enabled=False), **settings)
        app = create_app(config, opener or opener_of(engine))
        async with app.router.lifespan_context(app):
            # raise_app_exceptions=False: Starlette re-raises a 500's exception after replying, as it does
            # under uvicorn; the client sees the reply.
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://gatehead",
                                         headers={"Authorization": f"Bearer {KEY}"}) as client:
                services = app.state.services
                while wait and not (services.ready or services.failed):
                    await asyncio.sleep(0.01)
                engine.calls.clear()
                engine.fail, engine.hold = fail, hold
                yield client, services
    return start


def run(coroutine):
    return asyncio.run(coroutine)


def sse(body: str) -> list[tuple[str, dict]]:
    """(event, data) of every event in an SSE body; `data:` chunks without a name are ("data", ...)."""
    events = []
    for block in body.strip().split("\n\n"):
        name = re.search(r"^event: (.*)$", block, re.M)
        data = re.search(r"^data: (.*)$", block, re.M).group(1)
        events.append((name.group(1) if name else "data", json.loads(data) if data != "[DONE]" else data))
    return events


def test_the_guarded_engine_is_an_engine_and_nothing_more(engine) -> None:
    members = {n for n in Engine.__annotations__} | {n for n in vars(Engine) if not n.startswith("_")}
    guarded = GuardedEngine(engine())
    assert all(hasattr(guarded, name) for name in members)
    assert not hasattr(guarded, "check_length") and "__getattr__" not in vars(GuardedEngine)


def test_an_unexpected_failure_is_a_500_with_the_request_id_the_log_files_it_under(service, engine,
                                                                                   caplog) -> None:
    async def go():
        async with service(engine(), fail=ValueError("an internal bug, not the client's")) as (client, _):
            reply = await client.post("/v1/gate", json=GATE)
            metrics = (await client.get("/metrics")).text
        return reply, metrics

    with caplog.at_level(logging.ERROR, "gatehead.server"):
        reply, metrics = run(go())
    rid = reply.headers["x-request-id"]
    assert reply.status_code == 500 and reply.json()["error"]["type"] == "server_error"
    assert rid in reply.json()["error"]["message"] and "internal bug" not in reply.json()["error"]["message"]
    logged = [r for r in caplog.records if rid in r.getMessage()]
    assert logged and "an internal bug" in str(logged[0].exc_info[1])
    assert 'gatehead_requests_total{route="/v1/gate",status="500"} 1.0' in metrics


def test_only_a_typed_input_error_is_a_400(service, engine) -> None:
    async def go():
        async with service(engine(), fail=InvalidInput("the engine refuses this prompt")) as (client, _):
            refused = await client.post("/v1/gate", json=GATE)
            blank = await client.post("/v1/gate", json={**GATE, "question": "   "})
            thresholds = await client.post("/v1/gate", json={**GATE, "thresholds": {"answer": 2}})
            unknown = await client.post("/v1/gate", json={"items": [GATE, {**GATE, "thresholds": {"x": 0.5}}]})
            long = await client.post("/v1/chat/completions", json={"model": "model", "max_tokens": 5000,
                                                                  "messages": [{"role": "user", "content": "hi"}]})
            timeout = await client.post("/v1/gate", json=GATE, headers={"X-Gatehead-Timeout": "soon"})
        return refused, blank, thresholds, unknown, long, timeout

    refused, blank, thresholds, unknown, long, timeout = run(go())
    for reply, said in ((refused, "the engine refuses"), (blank, "the question is empty"), (thresholds, "[0, 1]"),
                        (unknown, "unknown threshold"), (long, "1024-token context"), (timeout, "X-Gatehead-Timeout")):
        assert reply.status_code == 400, (said, reply.text)
        assert said in reply.json()["error"]["message"] and reply.json()["error"]["type"] == "invalid_request_error"


def test_vllm_servers_that_cannot_serve_are_a_503_whole_or_streamed(service, engine) -> None:
    from gatehead.runtime.remote import EngineUnavailable

    async def go():
        async with service(engine(), fail=EngineUnavailable("every vLLM server is out of service")) as (client,
                                                                                                        services):
            pokes = []
            services.trouble = lambda: pokes.append(1)
            whole = await client.post("/v1/gate", json=GATE)
            streamed = await client.post("/v1/agent/chat", json={"message": "How long?", "stream": True})
        return whole, streamed, len(pokes)

    whole, streamed, pokes = run(go())
    assert whole.status_code == 503 and whole.headers["Retry-After"] == "5"
    error = whole.json()["error"]
    assert error["type"] == "engine_unavailable" and "out of service" in error["message"]
    kind, last = sse(streamed.text)[-1]
    assert kind == "error" and last["code"] == 503 and "out of service" in last["message"]
    assert pokes == 2  # the canaries are told, as for a 500


def test_keys_are_checked_and_threads_are_the_tenants_own(service, engine) -> None:
    async def go():
        scripted = engine()
        async with service(scripted) as (client, _):
            nobody = await client.post("/v1/gate", json=GATE, headers={"Authorization": ""})
            wrong = await client.post("/v1/gate", json=GATE, headers={"Authorization": "Bearer nope"})
            probe = await client.get("/livez", headers={"Authorization": ""})
            turn = await client.post("/v1/agent/chat", json={"message": "How long is the warranty?",
                                                             "thread_id": "t1"})
            mine = await client.get("/v1/agent/threads/t1")
            theirs = await client.get("/v1/agent/threads/t1", headers={"Authorization": f"Bearer {OTHER}"})
            await client.post("/v1/gate", json=GATE, headers={"Authorization": f"Bearer {OTHER}"})
        return scripted, nobody, wrong, probe, turn, mine, theirs

    scripted, nobody, wrong, probe, turn, mine, theirs = run(go())
    assert nobody.status_code == wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert probe.status_code == 200
    assert turn.status_code == 200 and turn.json()["decision"] == "answer" and turn.json()["sources"] == ["vale.md"]
    assert mine.status_code == 200 and [t["role"] for t in mine.json()["turns"]] == ["user", "assistant"]
    assert theirs.status_code == 404
    salts = [kw["cache_salt"] for _, kw in scripted.calls]
    assert None not in salts and len(set(salts)) == 2  # one prefix-cache salt per key


def test_bodies_over_the_limit_are_413_declared_or_not(service, engine) -> None:
    async def chunks():
        for _ in range(10):
            yield b" " * 100

    async def go():
        async with service(engine(), max_body_bytes=500) as (client, _):
            declared = await client.post("/v1/gate", content=b"{" + b" " * 600 + b"}",
                                         headers={"Content-Type": "application/json"})
            streamed = await client.post("/v1/gate", content=chunks(), headers={"Content-Type": "application/json"})
        return declared, streamed

    for reply in run(go()):
        assert reply.status_code == 413 and "500-byte limit" in reply.json()["error"]["message"]


def test_requests_past_the_inflight_bound_are_shed_before_any_work(service, engine) -> None:
    async def go():
        hold, scripted = asyncio.Event(), engine()
        async with service(scripted, hold=hold, max_inflight=1) as (client, _):
            first = asyncio.create_task(client.post("/v1/gate", json=GATE))
            while not scripted.calls:
                await asyncio.sleep(0.01)
            shed = await client.post("/v1/gate", json=GATE)
            calls = len(scripted.calls)
            hold.set()
            return await first, shed, calls, (await client.get("/metrics")).text

    first, shed, calls, metrics = run(go())
    assert first.status_code == 200 and calls == 1
    assert shed.status_code == 503 and shed.headers["retry-after"] == "1"
    assert shed.json()["error"]["type"] == "overloaded" and "gatehead_shed_requests_total 1.0" in metrics


def test_a_deadline_cancels_the_engine_work(service, engine) -> None:
    async def go():
        scripted = engine()
        async with service(scripted, hold=asyncio.Event(), request_timeout=30.0) as (client, _):  # never set
            reply = await client.post("/v1/gate", json=GATE, headers={"X-Gatehead-Timeout": "0.2"})
            stream = await client.post("/v1/agent/chat", json={"message": "How long?", "stream": True},
                                       headers={"X-Gatehead-Timeout": "0.2"})
            metrics = (await client.get("/metrics")).text
        return scripted, reply, stream, metrics

    scripted, reply, stream, metrics = run(go())
    assert reply.status_code == 504 and reply.json()["error"]["type"] == "timeout"
    assert sse(stream.text)[-1] == ("error", {"message": "the request ran past its deadline; its work was cancelled",
                                              "code": 504})
    assert scripted.cancelled == 2 and "gatehead_deadline_exceeded_total 2.0" in metrics


def test_a_second_turn_on_a_busy_thread_is_a_409(service, engine) -> None:
    async def go():
        hold, scripted = asyncio.Event(), engine()
        async with service(scripted, hold=hold) as (client, _):
            body = {"message": "How long is the warranty?", "thread_id": "busy"}
            first = asyncio.create_task(client.post("/v1/agent/chat", json=body))
            while not scripted.calls:
                await asyncio.sleep(0.01)
            second = await client.post("/v1/agent/chat", json=body)
            streamed = await client.post("/v1/agent/chat", json={**body, "stream": True})
            hold.set()
            return await first, second, streamed

    first, second, streamed = run(go())
    assert first.status_code == 200
    assert second.status_code == 409 and second.json()["error"]["type"] == "conflict"
    assert sse(streamed.text)[-1][0] == "error" and sse(streamed.text)[-1][1]["code"] == 409


def test_until_started_the_api_is_503_and_a_failed_start_says_so(service, engine) -> None:
    async def go():
        ready, scripted = asyncio.Event(), engine()
        async with service(scripted, opener=opener_of(scripted, ready=ready), wait=False) as (client, _):
            starting = [await client.get("/readyz"), await client.post("/v1/gate", json=GATE)]
            ready.set()
        scripted = engine()
        async with service(scripted, opener=opener_of(scripted, fail=RuntimeError("no engine"))) as (client, _):
            failed = [await client.get("/livez"), await client.get("/readyz"), await client.post("/v1/gate", json=GATE)]
        return starting, failed

    starting, failed = run(go())
    assert [r.status_code for r in starting + failed] == [503] * 5
    assert starting[0].json() == {"status": "starting"} and starting[1].headers["retry-after"] == "5"
    assert "starting" in starting[1].json()["error"]["message"]
    assert failed[0].json() == {"status": "failed"} == failed[1].json()  # the reason is in the log only
    assert "failed to start" in failed[2].json()["error"]["message"]


def test_a_failure_inside_a_stream_ends_it_with_one_error_event(service, engine) -> None:
    async def go():
        async with service(engine(), fail=RuntimeError("boom")) as (client, _):
            agent = await client.post("/v1/agent/chat", json={"message": "How long?", "stream": True})
            plain = await client.post("/v1/chat/completions", json={
                "model": "model", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        return agent, plain

    agent, plain = run(go())
    kind, data = sse(agent.text)[-1]
    assert agent.status_code == 200 and kind == "error" and data["code"] == 500
    rid = agent.headers["x-request-id"]
    assert rid in data["message"] and "boom" not in data["message"]
    events = sse(plain.text)
    assert events[0][1]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1][1]["error"]["type"] == "server_error" and events[-1][1]["error"]["code"] == 500


def test_the_openai_api_refuses_what_it_does_not_implement(service, engine) -> None:
    def ask(**fields):
        return {"model": "gatehead-agent", "messages": [{"role": "user", "content": "How long?"}], **fields}

    async def go():
        async with service(engine()) as (client, _):
            return [await client.post("/v1/chat/completions", json=body) for body in (
                ask(tools=[{"type": "function"}]), ask(model="gpt-4"), ask(temperature=0.7),
                ask(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), ask(max_tokens=10_000), ask())]

    tools, model, hot, image, budget, fine = run(go())
    assert (tools.status_code, model.status_code, hot.status_code, image.status_code, budget.status_code) == \
        (400, 404, 400, 400, 400)
    assert "tools" in tools.json()["error"]["message"] and "temperature" in hot.json()["error"]["message"]
    assert fine.status_code == 200 and fine.json()["gatehead"]["decision"] == "answer"
    assert fine.json()["choices"][0]["message"]["content"] == "The warranty lasts two years [1]."


def test_openai_agent_turns_leave_no_thread_behind_and_failures_check_the_canaries(service, engine) -> None:
    async def go():
        scripted = engine()
        async with service(scripted) as (client, services):
            pokes = []
            services.trouble = lambda: pokes.append(1)
            body = {"model": "gatehead-agent", "messages": [{"role": "user", "content": "How long?"}]}
            whole = await client.post("/v1/chat/completions", json=body)
            streamed = await client.post("/v1/chat/completions", json={**body, "stream": True})
            chat = await client.post("/v1/agent/chat", json={"message": "How long?", "thread_id": "kept"})
            threads = {key for key, checkpoints in services.saver.storage.items() if checkpoints}
            healthy = len(pokes)
            scripted.fail = RuntimeError("boom")
            failed = await client.post("/v1/gate", json=GATE)  # a 500
            stream = await client.post("/v1/agent/chat", json={"message": "How long?", "stream": True})
        return whole, streamed, chat, threads, healthy, failed, stream, len(pokes)

    whole, streamed, chat, threads, healthy, failed, stream, pokes = run(go())
    assert whole.status_code == streamed.status_code == chat.status_code == 200
    assert sse(streamed.text)[-1] == ("data", "[DONE]")
    assert len(threads) == 1 and next(iter(threads)).endswith(":kept")  # the one-off threads were deleted
    assert healthy == 0 and failed.status_code == 500 and sse(stream.text)[-1][1]["code"] == 500
    assert pokes == 2  # once for the 500, once for the stream that failed after its 200


def test_every_route_reports_the_decision_the_user_got_and_whether_the_answer_is_grounded(service, engine) -> None:
    from gatehead.agent.prompts import CLARIFY, REFUSAL

    def openai(question: str, stream: bool = False) -> dict:
        return {"model": "gatehead-agent", "messages": [{"role": "user", "content": question}], "stream": stream}

    async def turns(scripted, question: str) -> list:
        async with service(scripted) as (client, _):
            return [await client.post("/v1/agent/chat", json={"message": question}),
                    await client.post("/v1/agent/chat", json={"message": question, "stream": True}),
                    await client.post("/v1/chat/completions", json=openai(question)),
                    await client.post("/v1/chat/completions", json=openai(question, stream=True)),
                    await client.get("/metrics")]

    question = "How long is the Vale Lantern's warranty?"
    for scripted, asked, decision, reason, grounded, said in (
            (engine(answer=REFUSAL), question, "refuse", "generated", None, REFUSAL),  # the gate said answer
            (engine(*["refuse"] * 4), question, "refuse", "gate", None, REFUSAL),
            (engine(), "And its weight?", "clarify", None, None, CLARIFY),
            (engine(answer="A 5-year warranty [1]."), question, "answer", None, False, "A 5-year warranty [1]."),
            (engine(), question, "answer", None, True, "The warranty lasts two years [1].")):
        whole, streamed, completion, chunks, metrics = run(turns(scripted, asked))
        final = sse(streamed.text)[-1]
        assert final[0] == "final"
        for body in (whole.json(), final[1], completion.json()["gatehead"], sse(chunks.text)[-2][1]["gatehead"]):
            assert (body["decision"], body["refusal_reason"], body["grounded"]) == (decision, reason, grounded), body
        assert whole.json()["answer"] == final[1]["answer"] == said
        assert completion.json()["choices"][0]["message"]["content"] == said
        # A streamed turn says its text once: generated tokens, or the fixed sentence in one chunk.
        assert "".join(e[1]["choices"][0]["delta"].get("content", "") for e in sse(chunks.text)[:-1]) == said
        assert f'gatehead_agent_turns_total{{decision="{decision}"}} 4.0' in metrics.text
        assert 'gatehead_agent_turns_total{decision="not_found"} 0.0' in metrics.text  # every decision shows


def test_every_route_runs_answers_beside_the_gate_when_the_service_is_set_to(service, engine) -> None:
    """`AgentConfig.answer_beside_gate` through the service: a refused turn on every route says the refusal
    and nothing of the answer that was started beside its gate; each gate reports what it wasted."""
    from gatehead.agent import AgentConfig
    from gatehead.agent.prompts import REFUSAL

    question = "How long is the Vale Lantern's warranty?"
    openai = {"model": "gatehead-agent", "messages": [{"role": "user", "content": question}]}

    async def turns(scripted) -> list:
        async with service(scripted, agent=AgentConfig(answer_beside_gate=True)) as (client, _):
            return [await client.post("/v1/agent/chat", json={"message": question}),
                    await client.post("/v1/agent/chat", json={"message": question, "stream": True}),
                    await client.post("/v1/chat/completions", json=openai),
                    await client.post("/v1/chat/completions", json={**openai, "stream": True}),
                    await client.get("/metrics")]

    for scripted, said in ((engine(*["refuse"] * 4, gate_seconds=0.05), REFUSAL),
                           (engine(gate_seconds=0.05), "The warranty lasts two years [1].")):
        whole, streamed, completion, chunks, metrics = run(turns(scripted))
        words = len(scripted.answer.split(" "))
        assert scripted.streamed == [words] * 4  # every turn started its answer beside the gate
        gates = [whole.json()["gates"], sse(streamed.text)[-1][1]["gates"], completion.json()["gatehead"]["gates"],
                 sse(chunks.text)[-2][1]["gatehead"]["gates"]]
        wasted = words if said == REFUSAL else None
        assert [g[-1].get("wasted_answer_tokens") for g in gates] == [wasted] * 4
        assert whole.json()["answer"] == sse(streamed.text)[-1][1]["answer"] == said
        assert "".join(e[1]["text"] for e in sse(streamed.text) if e[0] == "token") == ("" if wasted else said)
        assert completion.json()["choices"][0]["message"]["content"] == said
        assert "".join(e[1]["choices"][0]["delta"].get("content", "") for e in sse(chunks.text)[:-1]) == said
        assert f"gatehead_wasted_answer_tokens_total {float(4 * (wasted or 0))}" in metrics.text


def test_a_rewrite_that_fails_its_check_is_in_the_turns_result(service, engine) -> None:
    async def go():
        async with service(engine()) as (client, _):
            await client.post("/v1/agent/chat", json={"message": "How long is the Vale Lantern's warranty?",
                                                      "thread_id": "t"})
            return await client.post("/v1/agent/chat", json={"message": "And its weight?", "thread_id": "t"})

    # The server's engine generates through its stream, so the scripted rewrite is the scripted answer: the
    # thread's previous answer, which a weak model also wrote as the standalone question.
    body = run(go()).json()
    joined = "How long is the Vale Lantern's warranty? And its weight?"
    assert body["queries"] == [joined] and body["rewrite_fallbacks"] == [
        {"node": "contextualize", "rewrite": "The warranty lasts two years [1].", "used": joined,
         "reason": "an earlier answer"}]


def test_openai_usage_counts_every_engine_request_of_the_turn_and_streams_it_last_when_asked(service,
                                                                                              engine) -> None:
    body = {"model": "gatehead-agent", "messages": [{"role": "user", "content": "How long?"}]}

    async def go():
        scripted = engine("search", "answer", answer="It lasts two years [1].")
        async with service(scripted) as (client, services):
            whole = await client.post("/v1/chat/completions", json=body)
            scripted.decisions = ["search", "answer"]
            asked = await client.post("/v1/chat/completions",
                                      json={**body, "stream": True, "stream_options": {"include_usage": True}})
            unasked = await client.post("/v1/chat/completions", json={**body, "stream": True})
            plain = {"model": services.config.base_name, "messages": body["messages"], "max_tokens": 4}
            plain_whole = await client.post("/v1/chat/completions", json=plain)
            plain_asked = await client.post("/v1/chat/completions",
                                            json={**plain, "stream": True, "stream_options": {"include_usage": True}})
            alone = await client.post("/v1/chat/completions", json={**body, "stream_options": {"include_usage": True}})
        return whole.json(), sse(asked.text), sse(unasked.text), plain_whole.json(), sse(plain_asked.text), alone

    whole, asked, unasked, plain_whole, plain_asked, alone = run(go())
    usage, nodes = whole["usage"], whole["gatehead"]["usage"]
    # Two gates, the rewrite between them and the answer; the service's generations stream (the guard reads
    # them), and the scripted stream is the answer's 5 words, a token each: the rewrite's too.
    assert set(nodes) == {"gate", "rewrite", "generate"} and nodes["gate"]["completion_tokens"] == 0
    assert nodes["rewrite"]["completion_tokens"] == nodes["generate"]["completion_tokens"] == 5
    assert usage["completion_tokens"] == 10
    assert usage["prompt_tokens"] == sum(n["prompt_tokens"] for n in nodes.values())
    assert usage["total_tokens"] == usage["prompt_tokens"] + 10 and nodes["gate"]["prompt_tokens"] > 0
    # The scripted stream reads all but one prompt token from the cache; the scripted gate none.
    assert usage["prompt_tokens_details"]["cached_tokens"] == \
        nodes["rewrite"]["prompt_tokens"] - 1 + nodes["generate"]["prompt_tokens"] - 1
    data = [d for _, d in asked if d != "[DONE]"]
    assert data[-1]["choices"] == [] and data[-1]["usage"] == usage and asked[-1] == ("data", "[DONE]")
    assert all(d["usage"] is None for d in data[:-1])  # OpenAI's stream: null until the last chunk
    assert all("usage" not in d for _, d in unasked if d != "[DONE]")
    assert plain_whole["usage"]["completion_tokens"] == 5  # the scripted stream: the whole answer, 5 tokens
    last = [d for _, d in plain_asked if d != "[DONE]"][-1]
    assert last["choices"] == [] and last["usage"] == plain_whole["usage"]
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "stream_options"


def test_every_body_that_fails_its_schema_is_a_400_in_openais_shape_naming_the_field(service, engine) -> None:
    chat = {"model": "gatehead-agent", "messages": [{"role": "user", "content": "How long?"}]}
    cases = [("/v1/chat/completions", {**chat, "n": 2}, "n"),
             ("/v1/chat/completions", {**chat, "temperature": 7.5}, "temperature"),
             ("/v1/chat/completions", {**chat, "messages": []}, "messages"),
             ("/v1/chat/completions", {**chat, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
             ("/v1/chat/completions", {"messages": chat["messages"]}, "model"),
             ("/v1/gate", {**GATE, "colour": "red"}, "colour"),
             ("/v1/agent/chat", {"message": "hi", "thread_id": "a\u0000b"}, "thread_id"),
             # A lone surrogate, as JSON carries it ("\ud800"): no text, refused before retrieval or the engine.
             ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "a\ud800"}]},
              "messages[0].content"),
             ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": [
                 {"type": "text", "text": "\udfff"}]}]}, "messages[0].content[0].text"),
             ("/v1/agent/chat", {"message": "How long?\ud800"}, "message"),
             ("/v1/gate", {**GATE, "documents": ["fine", "\ud83d"]}, "documents[1]"),
             # A union's scalar member is not named in param (pydantic's location says `stop.str`).
             ("/v1/chat/completions", {**chat, "model": "m", "stop": 5}, "stop"),
             ("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": 5}]}, "messages[0].content")]

    async def go():
        scripted, store = engine(), ScriptedStore()
        async with service(scripted, opener=opener_of(scripted, store)) as (client, _):
            replies = []
            for path, body, _ in cases:
                content = json.dumps(body, ensure_ascii=True)  # escapes kept: "\ud800" travels as clients send it
                replies.append(await client.post(path, content=content, headers={"content-type": "application/json"}))
            replies.append(await client.post("/v1/gate", content=b"{not json", headers={"content-type":
                                                                                       "application/json"}))
            return replies, list(scripted.calls), list(store.queries)

    replies, calls, queries = run(go())
    for (path, body, param), reply in zip(cases, replies, strict=False):
        error = reply.json()["error"]
        assert reply.status_code == 400 and error["param"] == param, (path, body, reply.text)
        assert error["type"] == "invalid_request_error" and error["code"] == 400 and error["message"]
    assert replies[-1].status_code == 400 and "not valid JSON" in replies[-1].json()["error"]["message"]
    assert replies[-1].json()["error"]["param"] is None
    assert calls == [] and queries == []  # nothing reached the engine or the store
