"""The gate in a stock `vllm serve`: vLLM's own OpenAI server, started with `gatehead vllm-args`' flags, serves
generation and the gate (both modes) through its stock API, refuses what the in-process engine refuses as
HTTP 400s, and `RemoteEngine` reaches it. Real server processes on the tiny model; on the demo model and its two
gates with `GATEHEAD_VLLM_SERVE_MODEL=demo` (`gatehead figures --only vllm-serve-demo` runs the equality and
prefix-cache tests so)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from gatehead.errors import InvalidInput
from gatehead.evals.workload import synthetic_prompts, synthetic_requests
from gatehead.gate.adapter import GateAdapter
from gatehead.gate.prompt import Passage
from gatehead.runtime.dtype import resolve_dtype
from gatehead.runtime.engine import EngineConfig, SharedEngine
from gatehead.runtime.remote import RemoteConfig, RemoteEngine
from gatehead.runtime.vllm_serve import ServerProcess, serve_command
from gatehead.tiny import TinyModel

DOCS = [Passage("The Vale Lantern has a two-year warranty.", source="vale.md"),
        Passage("Routers are reset by holding the button for ten seconds.", source="router.md")]
GATES = 12
HOST_DTYPE = resolve_dtype("auto")


DEMO = os.environ.get("GATEHEAD_VLLM_SERVE_MODEL", "tiny") == "demo"


@dataclass(frozen=True)
class DemoGate:
    """The demo model with one of its gates, as the tests read a `TinyModel`."""

    model_dir: Path
    adapter_dir: Path
    adapter: GateAdapter


Kit = TinyModel | DemoGate


def engine_config(kit: Kit, gate: bool = True) -> EngineConfig:
    """The runtime tests' engine shape (tests/integration/runtime/conftest.py); the demo engines' (2k context)."""
    return EngineConfig(model=kit.model_dir, adapter=kit.adapter_dir if gate else None,
                        kv_cache_memory_bytes=(512 if DEMO else 128) << 20, enforce_eager=True, block_size=32,
                        max_model_len=2048 if DEMO else 1024)


def demo_gate(which: int) -> DemoGate:
    from gatehead.gate.adapter import load_gate_adapter
    from gatehead.testing import demo_kit

    model, *adapters = demo_kit()
    return DemoGate(model, adapters[which], load_gate_adapter(adapters[which], model))


@pytest.fixture(scope="module")
def kit(request) -> Kit:
    """The prompt-mode gate the servers serve: `tiny`'s, or the demo's."""
    return demo_gate(0) if DEMO else request.getfixturevalue("tiny")


@pytest.fixture(scope="module")
def kit_suffix(request) -> Kit:
    """The suffix-mode gate on the same base: `tiny_suffix`'s, or the demo's."""
    return demo_gate(1) if DEMO else request.getfixturevalue("tiny_suffix")


@pytest.fixture(scope="module")
def prompt_inprocess(request, kit) -> Iterator[SharedEngine]:
    """The in-process engine on the prompt-mode gate: the runtime tests' `shared_eager`, or a demo one."""
    if not DEMO:
        yield request.getfixturevalue("shared_eager")
        return
    engine = SharedEngine(engine_config(kit))
    yield engine
    engine.shutdown()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer(ServerProcess):
    """`vllm serve` (vLLM's server module) on a config, in its own process group; `stock` without gatehead's
    plugin (`VLLM_PLUGINS` naming no plugin)."""

    def __init__(self, config: EngineConfig, workdir: Path, name: str, stock: bool = False) -> None:
        self.port = free_port()
        command = serve_command(config, host="127.0.0.1", port=self.port)
        self.name = command.served_model_name
        # The suite's engine layout (tests/conftest.py: the engine core inside the server's process, one thread):
        # the HTTP API, the frontend's rules and the worker are the deployed ones; it starts faster.
        super().__init__(command, f"http://127.0.0.1:{self.port}", workdir / f"{name}.log",
                         {"VLLM_PLUGINS": ""} if stock else {})

    def wait(self) -> None:
        self.wait_ready(600)  # a failure deadline beside the other worker's engines, not a bound

    def post(self, path: str, body: dict) -> httpx.Response:
        # JSON written here, escapes kept: a lone surrogate travels as the text "\ud800", as clients send it.
        content = json.dumps({"model": self.name, **body}, ensure_ascii=True)
        return httpx.post(f"{self.url}{path}", content=content, headers={"content-type": "application/json"},
                          timeout=120)


@pytest.fixture(scope="module")
def servers(kit: Kit, kit_suffix: Kit, tmp_path_factory) -> Iterator[dict[str, VllmServer]]:
    """Three servers started together: the gate in prompt mode (`kit`), in suffix mode (`kit_suffix`), and
    stock vLLM on the same base with plugins off."""
    workdir = tmp_path_factory.mktemp("vllm-serve")
    made = {"prompt": VllmServer(engine_config(kit), workdir, "prompt"),
            "suffix": VllmServer(engine_config(kit_suffix), workdir, "suffix"),
            "stock": VllmServer(engine_config(kit, gate=False), workdir, "stock", stock=True)}
    try:
        for server in made.values():
            server.wait()
        yield made
    finally:
        for server in made.values():
            server.stop()


def remote(server: VllmServer, kit: Kit) -> RemoteEngine:
    return RemoteEngine(RemoteConfig(urls=(server.url,), model=kit.model_dir, adapter=kit.adapter_dir))


def probs(outcomes) -> np.ndarray:
    return np.array([[o.result.probs[k] for k in ("answer", "refuse", "search")] for o in outcomes])


def gate_prompts(engine) -> list[tuple[int, ...]]:
    return synthetic_prompts(engine.prompts, GATES, seed=5)


@pytest.fixture(scope="module")
def suffix_inprocess(kit_suffix: Kit) -> Iterator[SharedEngine]:
    engine = SharedEngine(engine_config(kit_suffix))
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("mode", ["prompt", "suffix"])
def test_gates_through_vllms_api_equal_the_in_process_engines(mode, servers, prompt_inprocess, suffix_inprocess, kit,
                                                              kit_suffix, loop, record_figure) -> None:
    """The same gate prompts, one at a time, through the server's `/v1/completions` and through the in-process
    engine on the same model, adapter and dtype: the same decisions, the same probabilities (one request per
    step in both, so the same batches: only the process layout differs)."""
    inprocess, model = (prompt_inprocess, kit) if mode == "prompt" else (suffix_inprocess, kit_suffix)
    engine = remote(servers[mode], model)
    prompts = gate_prompts(inprocess)
    assert prompts == gate_prompts(engine)  # laid out alike from the files read locally

    async def run(e):
        return [await e.gate_prompt(p) for p in prompts]

    over_http, local = loop.run(run(engine)), loop.run(run(inprocess))
    dp = float(np.abs(probs(over_http) - probs(local)).max())
    flips = sum(a.result.decision != b.result.decision for a, b in zip(over_http, local, strict=True))
    record_figure(f"vllm-serve/{mode}", f"gate over vllm serve's API vs in process, {mode} mode, {GATES} gates, "
                  f"{HOST_DTYPE}", {"max_dp": dp, "flips": flips})
    print(f"{mode}: max |dp| {dp:.3g}, {flips} flips")
    assert flips == 0
    assert dp <= (1e-6 if HOST_DTYPE == "float32" else 1e-3), dp


def test_the_answer_reads_the_gates_prefix_blocks_over_http(servers, kit, kit_suffix, loop) -> None:
    """vLLM's usage reports the prompt tokens read from the prefix cache (`--enable-prompt-tokens-details`):
    the answer after a gate reads the gate's blocks, and a suffix-mode gate reads a cached conversation."""
    for mode, model in (("prompt", kit), ("suffix", kit_suffix)):
        engine = remote(servers[mode], model)
        prompt = engine.prompts.build("How long is the Vale Lantern's warranty?", DOCS)
        salt = f"tenant-{mode}"  # no other test's blocks: each salt has a prefix cache of its own
        gated = loop.run(engine.gate_prompt(prompt.gate, cache_salt=salt))
        answer = loop.run(engine.generate(prompt.answer, max_tokens=4, cache_salt=salt))
        assert gated.num_cached_tokens == 0 and answer.num_cached_tokens >= 32, (mode, answer.num_cached_tokens)
        again = loop.run(engine.gate_prompt(prompt.gate, cache_salt=salt))
        if mode == "suffix":  # whole blocks before the suffix
            assert again.num_cached_tokens == (len(prompt.gate) - len(engine.suffix_ids)) // 32 * 32 > 0
        else:  # a prompt-mode gate computes every row
            assert again.num_cached_tokens == 0


def test_generation_through_the_plugin_equals_stock_vllm_serve(servers) -> None:
    """Greedy completions (text, token ids, logprobs) from the gated server and from stock `vllm serve` with plugins
    off: the same tokens; logprobs within fp32 rounding (bf16: the stability rule's near-tie allowance)."""
    body = {"max_tokens": 12, "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True,
            "ignore_eos": True}
    for text in [r.question for r in synthetic_requests(4, seed=9)]:
        ids = servers["stock"].post("/v1/completions", {**body, "prompt": text}).json()
        gated = servers["prompt"].post("/v1/completions", {**body, "prompt": text}).json()
        a, b = ids["choices"][0]["logprobs"], gated["choices"][0]["logprobs"]
        assert a["tokens"] == b["tokens"], text
        assert np.allclose(a["token_logprobs"], b["token_logprobs"], atol=1e-5 if HOST_DTYPE == "float32" else 0.05)


@pytest.mark.parametrize("case", ["n", "max_tokens", "prompt_logprobs", "structured", "no_suffix", "reserved_inside",
                                  "reserved_in_generation", "chat_with_suffix", "suffix_without_length",
                                  "lone_surrogate"])
def test_what_the_in_process_engine_refuses_is_a_400_from_vllm(case, servers, prompt_inprocess, kit) -> None:
    """Every refusal through the stock API is vLLM's 400 with its error body: never a gate, never a 500."""
    gate = list(prompt_inprocess.prompts.build("How long is the warranty?", DOCS).gate)
    suffix = kit.adapter.spec.suffix
    reserved = prompt_inprocess.action_ids[0]
    server, path = servers["prompt"], "/v1/completions"
    body = {"prompt": gate, "max_tokens": 1, "temperature": 0, "vllm_xargs": {"gatehead": "gate"}}
    body.update({
        "n": {"n": 2},
        "max_tokens": {"max_tokens": 3},
        "prompt_logprobs": {"prompt_logprobs": 1},
        "structured": {"structured_outputs": {"regex": "[a-z]+"}},
        "no_suffix": {"prompt": gate[:-1]},
        "reserved_inside": {"prompt": [*gate[:3], reserved, *gate[3:]]},
        "reserved_in_generation": {"prompt": [*gate[:3], reserved], "vllm_xargs": None, "max_tokens": 4},
        "lone_surrogate": {"prompt": "hello \ud800", "vllm_xargs": None, "max_tokens": 4},
    }.get(case, {}))
    if case == "chat_with_suffix":
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": f"hi {suffix}"}],
                                              "max_tokens": 4}
    if case == "suffix_without_length":
        server = servers["suffix"]
    reply = server.post(path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError" and error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_remote_engine_refuses_a_server_serving_another_adapter(servers, kit, kit_suffix, loop) -> None:
    """The prompt-mode server checked by a client holding the suffix-mode adapter: out of service, named."""
    wrong = RemoteEngine(RemoteConfig(urls=(servers["prompt"].url,), model=kit_suffix.model_dir,
                                      adapter=kit_suffix.adapter_dir))
    assert loop.run(wrong.check()) == {servers["prompt"].url: False}
    assert "not " in wrong.servers[0].last_error and wrong.served_name in wrong.servers[0].last_error
    right = remote(servers["prompt"], kit)
    assert loop.run(right.check()) == {servers["prompt"].url: True}
    with pytest.raises(InvalidInput, match="invocation suffix"):
        loop.run(right.gate_prompt([5, 6, 7]))


def test_a_server_that_refuses_connections_is_taken_out_and_the_request_served_by_the_next(servers, kit,
                                                                                          loop) -> None:
    """Two servers, one of them down: a turn whose key prefers the dead one is sent once to the live one, the dead
    one leaves service, and every later turn goes straight to the live one."""
    dead = f"http://127.0.0.1:{free_port()}"
    engine = RemoteEngine(RemoteConfig(urls=(dead, servers["prompt"].url), model=kit.model_dir,
                                       adapter=kit.adapter_dir, retry_after=600))
    key = next(k for k in (f"tenant/thread-{i}" for i in range(100)) if engine.order(k)[0].url == dead)
    prompt = engine.prompts.build("How long is the warranty?", DOCS)
    with engine.affinity(key):
        outcome = loop.run(engine.gate_prompt(prompt.gate))
        streamed = loop.run(_collect(engine.stream(prompt.answer, max_tokens=6, ignore_eos=True)))
    assert sum(outcome.result.probs.values()) == pytest.approx(1.0, abs=1e-5)
    first, second = engine.server_stats()
    assert first["url"] == dead and first["failures"] == 1 and not first["in_service"]
    assert second["retried_elsewhere"] == 1 and second["requests"] == 2
    assert loop.run(engine.stats())["servers_in_service"] == 1
    # Cumulative, the last one finished, and the same tokens and text a plain completion gives.
    lengths = [len(g.token_ids) for g in streamed]
    assert lengths == sorted(set(lengths)) and lengths[-1] == 6 and streamed[-1].finish_reason == "length"
    final = loop.run(engine.generate(prompt.answer, max_tokens=6, ignore_eos=True))
    assert (final.token_ids, final.text) == (streamed[-1].token_ids, streamed[-1].text)
    assert len(final.logprobs) == 6 and engine.alive and not engine.ready


async def _collect(stream) -> list:
    return [item async for item in stream]


def test_a_cancelled_stream_aborts_its_request_in_the_server(servers, kit, loop) -> None:
    """Closing a `RemoteEngine` stream closes its HTTP request, and vLLM aborts the request: the server's
    running requests drop to 0 and it generates a small part of the tokens asked for."""
    engine = remote(servers["prompt"], kit)
    prompt = engine.prompts.build("How long is the warranty?", DOCS).answer
    asked = kit_window() - len(prompt) - 8

    def metric(name: str) -> float:
        text = httpx.get(f"{servers['prompt'].url}/metrics", timeout=30).text
        return sum(float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))

    before = metric("vllm:generation_tokens_total")

    async def cut() -> int:
        stream = engine.stream(prompt, max_tokens=asked, ignore_eos=True)
        async for generation in stream:
            if len(generation.token_ids) >= 4:
                break
        await stream.aclose()
        return len(generation.token_ids)

    seen = loop.run(cut())
    deadline = time.monotonic() + 30
    while metric("vllm:num_requests_running") > 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    generated = metric("vllm:generation_tokens_total") - before
    loop.run(engine.aclose())
    assert metric("vllm:num_requests_running") == 0
    assert seen <= generated < asked / 2, (seen, generated, asked)


def kit_window() -> int:
    return 2048 if DEMO else 1024


def test_the_agents_routes_run_through_remote_engine(servers, kit, embedder, write_corpus, loop) -> None:
    """The agent over `RemoteEngine` on a real `vllm serve`: answer (its answer reading the gate's prefix blocks),
    follow-up, search and rewrite until not found, refusal, and a question asked back. The random tiny gate is
    steered by thresholds: which route a question takes is the demo model's tests' (tests/integration/agent)."""
    from langgraph.checkpoint.memory import InMemorySaver

    from gatehead.agent import Agent, AgentConfig
    from gatehead.gate.policy import Thresholds
    from gatehead.retrieval.config import StoreConfig
    from gatehead.retrieval.ingest import open_store

    corpus = write_corpus({"vale.md": "# Vale Lantern\n\nThe Vale Lantern has a two-year warranty and weighs 300 g.",
                           "router.md": "# Router\n\nRouters are reset by holding the button for ten seconds."})
    store = open_store(StoreConfig(path=corpus.parent / "qdrant", collection="remote"), (corpus,), embedder,
                       log=lambda _: None)
    engine, saver = remote(servers["prompt"], kit), InMemorySaver()

    def ask(answer: float, refuse: float, question: str, thread: str):
        agent = Agent(engine, store, AgentConfig(thresholds=Thresholds(answer, refuse), max_searches=1,
                                                 max_answer_tokens=16), saver)
        return loop.run(agent.ask(question, thread, cache_salt="tenant-routes"))

    try:
        answered = ask(0.0, 1.0, "How long is the Vale Lantern's warranty?", "r1")
        nodes = [t["node"] for t in answered.timings]
        assert answered.decision == "answer" and nodes == ["retrieve", "gate", "generate", "finish"], nodes
        usage = answered.usage["nodes"]
        assert usage["generate"]["cached_tokens"] >= 32 and usage["generate"]["completion_tokens"] >= 1
        follow = ask(0.0, 1.0, "And what does it weigh?", "r1")
        assert [t["node"] for t in follow.timings][:2] == ["contextualize", "retrieve"]
        assert follow.decision == "answer" and follow.usage["nodes"]["contextualize"]["prompt_tokens"] > 0
        searched = ask(1.0, 1.0, "Where is the reset button?", "r2")
        assert searched.decision == "not_found" and [g["decision"] for g in searched.gates] == ["search", "search"]
        assert len(searched.queries) == 2 and "rewrite" in [t["node"] for t in searched.timings]
        refused = ask(1.0, 0.0, "Who painted the Mona Lisa?", "r3")
        assert (refused.decision, refused.refusal_reason) == ("refuse", "gate") and not refused.generated
        asked_back = ask(0.0, 1.0, "And its weight?", "r4")
        assert asked_back.decision == "clarify" and not asked_back.gates
    finally:
        store.close()
        loop.run(engine.aclose())


def test_gatehead_ask_runs_a_turn_on_a_vllm_server(servers, kit, tmp_path) -> None:
    """`gatehead ask --vllm-url`: one turn on the server, its result as JSON, and a clean exit."""
    done = subprocess.run([str(Path(sys.executable).parent / "gatehead"), "ask", "How long is the warranty?", "--json",
                           "--model", str(kit.model_dir), "--adapter", str(kit.adapter_dir), "--t-answer", "0",
                           "--max-tokens", "8", "--store", str(tmp_path / "qdrant"),
                           "--vllm-url", servers["prompt"].url],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["decision"] == "answer" and result["gates"][0]["decision"] == "answer"
    assert result["usage"]["nodes"]["generate"]["completion_tokens"] >= 1


def test_gatehead_serve_on_two_vllm_servers_keeps_a_thread_on_one_and_survives_losing_it(servers, kit,
                                                                                          tmp_path) -> None:
    """`gatehead serve --vllm-url A,B`: the service, the agent and the canaries on two `vllm serve` servers. A
    thread's turn goes to the server its thread hashes to (the per-server counters in /metrics); killed while the
    thread's next turn streams its answer, that server gives the turn one error event, /readyz turns 503 naming
    it, and the thread's next turn is served by the other, the thread's history intact."""
    from gatehead.runtime.affinity import turn_key
    from gatehead.server.middleware import tenant_of_key

    second = VllmServer(engine_config(kit), tmp_path, "second")
    service, client, log = None, None, (tmp_path / "serve.log").open("w")
    try:
        second.wait()
        port, key = free_port(), "remote-key"
        # A thread that hashes to the second server, the one this test owns and kills.
        urls = (servers["prompt"].url, second.url)
        router = RemoteEngine(RemoteConfig(urls=urls, model=kit.model_dir, adapter=kit.adapter_dir))
        tenant = tenant_of_key(key.encode())
        thread = next(t for t in (f"t{i}" for i in range(100))
                      if router.order(turn_key(tenant, f"{tenant}:{t}"))[0].url == second.url)
        router.shutdown()
        service = subprocess.Popen(
            [str(Path(sys.executable).parent / "gatehead"), "serve", "--port", str(port), "--api-key", key,
             "--model", str(kit.model_dir), "--adapter", str(kit.adapter_dir), "--max-tokens", "256",
             "--store", str(tmp_path / "qdrant"),  # empty: the servers are tested here, not retrieval
             "--vllm-url", ",".join(urls), "--canary-interval", "0",
             # The random tiny model writes garbled text, which the guard would stop; its random gate answers
             # everything at --t-answer 0 (the turns' routes are the agent tests'; here the servers are tested).
             "--no-guard", "--t-answer", "0"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120,
                              headers={"Authorization": f"Bearer {key}"})
        deadline = time.monotonic() + 600
        while not _ready(client):
            assert service.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)

        def sent() -> dict[str, float]:
            text = client.get("/metrics").text
            return {url: float(m.group(1)) for url in urls
                    for m in [re.search(rf'^gatehead_vllm_server_requests{{server="{re.escape(url)}"}} (\S+)', text,
                                        re.M)]}

        before = sent()
        first = client.post("/v1/agent/chat", json={"message": "How long is the warranty?", "thread_id": thread})
        assert first.status_code == 200 and first.json()["answer"], first.text
        middle = sent()
        moved = {url: middle[url] - before[url] for url in urls}
        assert moved[servers["prompt"].url] == 0 and moved[second.url] >= 2, moved  # the gate and the answer
        # The thread's next turn, streamed: its server killed at the answer's first token (the tiny model's answer
        # runs up to 256 tokens, several engine steps apart).
        events = []
        with client.stream("POST", "/v1/agent/chat", json={"message": "And what does it weigh?", "stream": True,
                                                           "thread_id": thread}) as streaming:
            for line in streaming.iter_lines():
                events.append(line)
                if line == "event: token" and second.process.poll() is None:
                    os.killpg(second.process.pid, signal.SIGKILL)
                    second.process.wait(30)
        assert second.process.poll() is not None, f"no answer token came: {events[-6:]}"
        assert events.count("event: error") == 1 and "event: final" not in events, events[-6:]
        assert '"code": 503' in events[events.index("event: error") + 1], events[-4:]
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["servers"] == [second.url], ready.text
        # The thread's next turn on the other server: the interrupted turn is finished from its checkpoint
        # first (its answer generated there), then the new one; the thread's history intact.
        after = client.post("/v1/agent/chat", json={"message": "And its warranty?", "thread_id": thread})
        assert after.status_code == 200 and after.json()["answer"], after.text
        turns = client.get(f"/v1/agent/threads/{thread}").json()["turns"]
        assert [t["text"] for t in turns[::2]] == ["How long is the warranty?", "And what does it weigh?",
                                                   "And its warranty?"]
        assert turns[1]["text"] == first.json()["answer"]
        assert sent()[servers["prompt"].url] > middle[servers["prompt"].url]
    finally:
        if service is not None and service.poll() is None:
            os.killpg(service.pid, signal.SIGTERM)
            service.wait(60)
        if client is not None:
            client.close()
        log.close()
        second.stop()


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False

