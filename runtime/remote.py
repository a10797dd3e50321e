"""`RemoteEngine`: the engine API over HTTP, to one or more stock `vllm serve` servers serving gatehead's gate.

Each server is vLLM's own OpenAI server started with `gatehead vllm-args` (`gatehead.runtime.vllm_serve`).
Prompts are laid out here, by the same `PromptBuilder` as in process, from the tokenizer and the gate
adapter read locally and checked against what each server reports (`/v1/models`: the model id carries
the adapter's fingerprint, and the context window). What travels, all through vLLM's stock API:
- a gate: `/v1/completions` with the gate prompt's token ids, `max_tokens` 1, `vllm_xargs` flagging the
  gate (and a suffix-mode gate's suffix length), `logprob_token_ids` the three action tokens and
  `return_tokens_as_token_ids`; the probabilities are `choices[0].logprobs.top_logprobs[0]`, keyed
  `token_id:N`;
- a generation: `/v1/completions` with token ids, streamed, `logprobs` 0 for each token's logprob and id,
  `stream_options.include_usage` for the prompt tokens read from the prefix cache (the server runs with
  `--enable-prompt-tokens-details`). Forcing a prompt to be computed afresh (the guard's retry) uses a
  fresh `cache_salt`, under which no cached block matches.
The server refuses what the in-process engine refuses, as HTTP 400 with vLLM's error body: it reaches
the caller as `InvalidInput` with vLLM's message.

With several servers, every request of one turn goes to the same server, so that the answer reads the
gate's prefix blocks: the server is chosen by rendezvous hashing on the turn's affinity key
(`gatehead.runtime.affinity`, which the agent sets to the tenant's thread; else the cache salt), among the
servers in service (`pinned` sends a block's requests to one server only: the canaries check each). A
server that refuses a connection is taken out of service and the request is sent once to the next in
the key's order; one whose response had begun is never repeated (a stream fails with `EngineUnavailable`).
A server out of service is tried again after `RemoteConfig.retry_after` seconds or a passing `check()`.
Cancelling a call closes its HTTP request, and vLLM aborts the request when its client disconnects.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gatehead.errors import InvalidInput
from gatehead.gate.policy import LABELS, Thresholds, gate_result
from gatehead.gate.prompt import Passage
from gatehead.runtime import affinity as routing
from gatehead.runtime.engine import EngineFront, GateError, GateOutcome, Generation
from gatehead.runtime.plan import EngineConfig, EnginePlan
from gatehead.runtime.plugin import GATE_FLAG, SUFFIX_FLAG


class EngineUnavailable(RuntimeError):
    """No server could serve the request, or the one serving it failed after its response had begun."""


@dataclass(frozen=True)
class RemoteConfig:
    """How `RemoteEngine` reaches its servers."""

    urls: tuple[str, ...]  # each server's base URL (http://host:port)
    model: str | Path  # the base model folder the servers serve (its tokenizer lays out prompts)
    adapter: str | Path  # the gate adapter they serve
    api_key: str | None = None  # vLLM's --api-key, if the servers were started with one
    max_gate_tokens: int | None = None  # as the servers were started (default: the context window)
    served_model_name: str | None = None  # default: what `gatehead vllm-args` names it
    connect_timeout: float = 5.0
    request_timeout: float = 600.0  # a whole request, streaming included
    retry_after: float = 10.0  # seconds before a server taken out of service is tried again

    def __post_init__(self) -> None:
        urls = tuple(u.rstrip("/") for u in self.urls)
        if not urls or any(not u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"give one or more server URLs as http(s)://host:port, got {list(self.urls)}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"a server URL is given twice: {list(self.urls)}")
        object.__setattr__(self, "urls", urls)


@dataclass
class Server:
    """One server and what this client has seen of it."""

    url: str
    in_service: bool = True
    down_since: float = 0.0
    requests: int = 0
    failures: int = 0  # connections refused or broken
    retried_elsewhere: int = 0
    last_error: str = ""
    max_model_len: int = 0
    misconfigured: bool = False  # `check` found it serving another adapter or window
    counters: dict[str, int] = field(default_factory=dict)

    def taken_out(self, error: BaseException) -> None:
        self.in_service, self.down_since = False, time.monotonic()
        self.failures += 1
        self.last_error = f"{type(error).__name__}: {error}"


class RemoteEngine(EngineFront):
    """The engine API (`gate`, `gate_prompt`, `gate_many`, `generate`, `generate_many`, `stream`, `stats`) over
    HTTP to `vllm serve` servers started with `gatehead vllm-args`."""

    def __init__(self, config: RemoteConfig) -> None:
        """Read the tokenizer and the adapter, and the context window from the first server that answers; `check`
        (and `warm_up`) then verify that every server serves this adapter's model id with that window."""
        import httpx

        self.config = config
        self.servers = [Server(url) for url in config.urls]
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        window = self._window(headers)  # before the client: a failed start leaves no connection pool open
        self.client = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(config.request_timeout,
                                                                               connect=config.connect_timeout),
                                        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64))
        plan = EnginePlan.of(EngineConfig(model=config.model, adapter=config.adapter, max_model_len=window,
                                          max_gate_tokens=config.max_gate_tokens))
        from gatehead.runtime.vllm_serve import served_model_name

        self.served_name = config.served_model_name or served_model_name(plan)
        self.model = str(config.model)
        self.tokenizer, self.adapter, self.prompts = plan.tokenizer, plan.adapter, plan.prompts
        self.max_model_len, self.max_gate_tokens = plan.max_model_len, plan.max_gate_tokens
        self.suffix_ids, self.action_ids = plan.suffix_ids, plan.action_ids
        self.gate_reserved = frozenset(self.action_ids) | frozenset(self.suffix_ids[-1:])
        self.seeded_sampling = True  # the servers refuse it where their platform cannot
        self._counts = {"generation_requests": 0, "gate_requests": 0}

    # ----- servers -------------------------------------------------------------------------------

    def _window(self, headers: dict[str, str]) -> int:
        """The context window the servers report (the first one that answers); all must agree (`check`)."""
        import httpx

        errors = []
        for server in self.servers:
            try:
                reply = httpx.get(f"{server.url}/v1/models", headers=headers, timeout=self.config.connect_timeout)
                reply.raise_for_status()
                return self._model_card(server, reply.json(), check_name=False)["max_model_len"]
            except (httpx.HTTPError, ValueError) as e:
                errors.append(f"{server.url}: {e}")
        raise EngineUnavailable("no vLLM server answered /v1/models: " + "; ".join(errors))

    def _model_card(self, server: Server, models: dict[str, Any], check_name: bool = True) -> dict[str, Any]:
        cards = models.get("data") or []
        if check_name:
            card = next((c for c in cards if c.get("id") == self.served_name), None)
            if card is None:
                raise ValueError(f"{server.url} serves {[c.get('id') for c in cards]}, not {self.served_name!r}: "
                                 f"another model or gate adapter than this client's (start it with `gatehead "
                                 f"vllm-args --model {self.model} --adapter {self.config.adapter}`)")
        else:
            card = cards[0] if cards else {}
        if not isinstance(card.get("max_model_len"), int):
            raise ValueError(f"{server.url}/v1/models reports no max_model_len: not a vLLM server")
        server.max_model_len = card["max_model_len"]
        return card

    async def check(self) -> dict[str, bool]:
        """Ask every server what it serves and run one gate on it; a server passes when it serves this adapter's
        model id with this client's window and returns a valid gate. Returns {url: in service}."""
        import httpx

        async def one(server: Server) -> None:
            try:
                reply = await self.client.get(f"{server.url}/v1/models")
                reply.raise_for_status()
                self._model_card(server, reply.json())
                if server.max_model_len != self.max_model_len:
                    raise ValueError(f"{server.url} serves a {server.max_model_len}-token window, the others "
                                     f"{self.max_model_len}: start every server with the same --max-model-len")
                probe = self.prompts.build("Is this server ready?", [Passage(text="A readiness probe.")])
                await self._gate_on(server, probe.gate, None)
            except (httpx.HTTPError, ValueError, GateError, InvalidInput) as e:
                server.taken_out(e)
                server.misconfigured = not isinstance(e, httpx.HTTPError)  # back through `check` only
                return
            server.in_service, server.misconfigured = True, False

        await asyncio.gather(*(one(s) for s in self.servers))
        return {s.url: s.in_service for s in self.servers}

    @property
    def alive(self) -> bool:
        """True while any server is in service (or due to be tried again)."""
        now = time.monotonic()
        return any(s.in_service or now - s.down_since >= self.config.retry_after for s in self.servers)

    @property
    def ready(self) -> bool:
        """True when every server is in service."""
        return all(s.in_service for s in self.servers)

    affinity = staticmethod(routing.affinity)  # the block's requests to the server a key hashes to
    pinned = staticmethod(routing.pinned)  # the block's requests to one server only

    async def health(self) -> dict[str, bool]:
        """Every server's `/health` now (vLLM's liveness route): a server that fails it is taken out of service,
        one that passes is put back, unless `check` found it serving another adapter or window. Returns
        {url: healthy and in service}."""
        import httpx

        async def one(server: Server) -> bool:
            try:
                reply = await self.client.get(f"{server.url}/health", timeout=self.config.connect_timeout)
                if reply.status_code != 200:
                    raise EngineUnavailable(f"/health answered {reply.status_code}")
            except (httpx.HTTPError, EngineUnavailable) as e:
                server.taken_out(e)
                return False
            server.in_service = not server.misconfigured
            return server.in_service

        return dict(zip((s.url for s in self.servers), await asyncio.gather(*(one(s) for s in self.servers)),
                        strict=True))

    def order(self, key: str) -> list[Server]:
        """The servers in the order `key` prefers them (rendezvous hashing): the first in service serves it."""
        def score(server: Server) -> bytes:
            return hashlib.sha256(f"{key}\0{server.url}".encode()).digest()

        return sorted(self.servers, key=score, reverse=True)

    def _candidates(self, cache_salt: str | None) -> list[Server]:
        pin = routing.pinned_url()
        if pin is not None:
            match = [s for s in self.servers if s.url == pin.rstrip("/")]
            if not match:
                raise ValueError(f"{pin} is not one of this engine's servers: {[s.url for s in self.servers]}")
            return match
        key = routing.affinity_key() or cache_salt or uuid.uuid4().hex  # no key: any server, spread evenly
        now = time.monotonic()
        ready = [s for s in self.order(key) if s.in_service or now - s.down_since >= self.config.retry_after]
        if not ready:
            raise EngineUnavailable("every vLLM server is out of service: " + "; ".join(
                f"{s.url} ({s.last_error})" for s in self.servers))
        return ready[:2]  # the key's server, and one other to retry on once

    # ----- requests ------------------------------------------------------------------------------

    def _raise_for(self, server: Server, reply: Any, body: bytes) -> None:
        """A server's error reply as gatehead's: 400 `InvalidInput` with vLLM's message, else `EngineUnavailable`."""
        try:
            error = json.loads(body).get("error") or {}
            message = error.get("message") if isinstance(error, dict) else str(error)
        except (ValueError, AttributeError):
            message = body[:500].decode(errors="replace")
        if reply.status_code == 400:
            raise InvalidInput(message or "the server refused the request")
        raise EngineUnavailable(f"{server.url} answered {reply.status_code}: {message}")

    async def _post(self, path: str, payload: dict[str, Any], cache_salt: str | None) -> tuple[Server, dict]:
        """POST `payload` to the turn's server; a connection failure takes it out and tries the next once."""
        import httpx

        candidates = self._candidates(cache_salt)
        for attempt, server in enumerate(candidates):
            server.requests += 1
            try:
                reply = await self.client.post(f"{server.url}{path}", json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as e:
                server.taken_out(e)
                if attempt + 1 < len(candidates):
                    candidates[attempt + 1].retried_elsewhere += 1
                    continue
                raise EngineUnavailable(f"{server.url} failed: {e}") from e
            if reply.status_code != 200:
                self._raise_for(server, reply, reply.content)
            server.in_service = True
            return server, reply.json()
        raise EngineUnavailable("no vLLM server could take the request")

    def _gate_payload(self, ids: list[int], cache_salt: str | None) -> dict[str, Any]:
        extra: dict[str, Any] = {GATE_FLAG: "gate"}
        if self.adapter.suffix_mode:
            extra[SUFFIX_FLAG] = len(self.suffix_ids)
        return {"model": self.served_name, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "logprobs": len(self.action_ids), "logprob_token_ids": list(self.action_ids),
                "return_tokens_as_token_ids": True, "vllm_xargs": extra,
                **({"cache_salt": cache_salt} if cache_salt else {})}

    def _outcome(self, body: dict[str, Any], ids: list[int], thresholds: Thresholds | None) -> GateOutcome:
        choice = (body.get("choices") or [{}])[0]
        entry = ((choice.get("logprobs") or {}).get("top_logprobs") or [{}])[0] or {}
        logprobs = {label: entry.get(f"token_id:{token}") for label, token in zip(LABELS, self.action_ids,
                                                                                 strict=True)}
        probs = {label: math.exp(lp) if isinstance(lp, (int, float)) else math.nan for label, lp in logprobs.items()}
        if any(not math.isfinite(p) for p in probs.values()) or abs(sum(probs.values()) - 1.0) > 1e-3:
            raise GateError(f"the server returned no valid gate probabilities ({probs}): is it serving gatehead's "
                            f"gate (started with `gatehead vllm-args`)?")
        cached = ((body.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return GateOutcome(gate_result(probs, thresholds or self.adapter.spec.thresholds), None, len(ids), cached)

    async def _gate_on(self, server: Server, ids: list[int], cache_salt: str | None) -> GateOutcome:
        reply = await self.client.post(f"{server.url}/v1/completions", json=self._gate_payload(ids, cache_salt))
        if reply.status_code != 200:
            self._raise_for(server, reply, reply.content)
        return self._outcome(reply.json(), ids, None)

    async def gate_prompt(self, prompt_ids: Sequence[int], thresholds: Thresholds | None = None,
                          cache_salt: str | None = None) -> GateOutcome:
        """Gate a laid-out gate prompt (token ids ending with the suffix, as `prompts.build(...).gate` makes)."""
        ids = self._token_ids(prompt_ids)
        n = len(self.suffix_ids)
        if tuple(ids[-n:]) != self.suffix_ids:
            raise InvalidInput("a gate prompt must end with the adapter's invocation suffix; build it with "
                               "engine.prompts.build(...).gate")
        self.check_length(ids, 1)
        self._counts["gate_requests"] += 1
        _, body = await self._post("/v1/completions", self._gate_payload(ids, cache_salt), cache_salt)
        return self._outcome(body, ids, thresholds)

    async def stream(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                     top_p: float = 1.0, stop: Sequence[str] = (), ignore_eos: bool = False, seed: int | None = None,
                     cache_salt: str | None = None, bypass_prefix_cache: bool = False,
                     priority: int = 0) -> AsyncIterator[Generation]:
        """Yield the generation so far after each streamed chunk (cumulative), the last one finished; as
        `SharedEngine.stream`. The servers must run the priority scheduler for `priority` to count."""
        import httpx

        if max_tokens < 1:
            raise InvalidInput(f"max_tokens must be >= 1, got {max_tokens}")
        ids = self._check_generation_prompt(prompt)
        self.check_length(ids, max_tokens)
        salt = cache_salt
        if bypass_prefix_cache:  # no cached block matches a fresh salt: the prompt is computed afresh
            salt = f"{cache_salt or ''}-fresh-{uuid.uuid4().hex}"[-128:]
        payload = {"model": self.served_name, "prompt": ids, "max_tokens": max_tokens, "temperature": temperature,
                   "top_p": top_p, "stop": list(stop) or None, "ignore_eos": ignore_eos, "seed": seed,
                   "logprobs": 0, "return_tokens_as_token_ids": True, "stream": True,
                   "stream_options": {"include_usage": True}, "priority": priority,
                   **({"cache_salt": salt} if salt else {})}
        self._counts["generation_requests"] += 1
        candidates = self._candidates(cache_salt)
        for attempt, server in enumerate(candidates):
            server.requests += 1
            began = False
            try:
                async with self.client.stream("POST", f"{server.url}/v1/completions", json=payload) as reply:
                    if reply.status_code != 200:
                        self._raise_for(server, reply, await reply.aread())
                    server.in_service = True
                    began = True
                    async for generation in self._generations(reply):
                        yield generation
                return
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as e:
                server.taken_out(e)
                if began:  # never repeated: part of it may have reached the caller
                    raise EngineUnavailable(f"{server.url} failed while streaming: {e}") from e
                if attempt + 1 < len(candidates):
                    candidates[attempt + 1].retried_elsewhere += 1
                    continue
                raise EngineUnavailable(f"{server.url} failed: {e}") from e

    async def _generations(self, reply: Any) -> AsyncIterator[Generation]:
        tokens: list[int] = []
        logprobs: list[float] = []
        text, finish, cached, last = "", None, 0, None
        async for line in reply.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("error"):
                raise EngineUnavailable(f"the server failed while streaming: {chunk['error']}")
            usage = chunk.get("usage")
            if usage:
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            for choice in chunk.get("choices") or []:
                text += choice.get("text") or ""
                lp = choice.get("logprobs") or {}
                tokens += [int(t.split(":", 1)[1]) for t in lp.get("tokens") or []]
                logprobs += [float(v) for v in lp.get("token_logprobs") or []]
                finish = choice.get("finish_reason") or finish
                last = Generation(list(tokens), text, list(logprobs), finish, cached)
                if finish is None:
                    yield last
        if last is None:
            raise EngineUnavailable("the server ended the stream without output")
        yield Generation(list(tokens), text, list(logprobs), finish, cached)

    async def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Generation:
        """Generate a completion of `prompt`; the keywords of `stream`."""
        final = None
        async for final in self.stream(prompt, **kwargs):  # noqa: B007
            pass
        return final

    async def generate_many(self, prompts: Sequence[str | Sequence[int]], **kwargs: Any) -> list[Generation]:
        return list(await asyncio.gather(*(self.generate(p, **kwargs) for p in prompts)))

    async def greedy_margins(self, prompt: str | Sequence[int], max_tokens: int, ignore_eos: bool = False
                             ) -> tuple[tuple[int, ...], tuple[float, ...], tuple[float, ...]]:
        """Greedy tokens of `prompt`, their logprobs, and each one's lead over the runner-up (the canaries' record),
        from the server's top-2 logprobs of each step."""
        ids = self._check_generation_prompt(prompt)
        self.check_length(ids, max_tokens)
        payload = {"model": self.served_name, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                   "ignore_eos": ignore_eos, "logprobs": 2, "return_tokens_as_token_ids": True}
        _, body = await self._post("/v1/completions", payload, None)
        logprobs = (body.get("choices") or [{}])[0].get("logprobs") or {}
        tokens = [int(t.split(":", 1)[1]) for t in logprobs.get("tokens") or []]
        chosen = tuple(float(v) for v in logprobs.get("token_logprobs") or [])
        margins = []
        for token, lp, top in zip(tokens, chosen, logprobs.get("top_logprobs") or [], strict=True):
            others = [float(v) for key, v in (top or {}).items() if key != f"token_id:{token}"]
            margins.append(lp - max(others, default=-math.inf))
        return tuple(tokens), chosen, tuple(margins)

    # ----- engine --------------------------------------------------------------------------------

    async def warm_up(self) -> None:
        """Check every server (`check`); EngineUnavailable naming each failure unless all are in service."""
        states = await self.check()
        if not all(states.values()):
            raise EngineUnavailable("vLLM servers not in service: " + "; ".join(
                f"{s.url} ({s.last_error})" for s in self.servers if not s.in_service))

    async def reset_prefix_cache(self) -> bool:
        """False: a server's prefix cache is its own (vLLM's reset endpoint is a development one)."""
        return False

    def server_stats(self) -> list[dict[str, Any]]:
        """Per server: its URL, whether it is in service, and this client's counts of requests sent to it,
        connections refused or broken, and requests retried elsewhere after it failed."""
        return [{"url": s.url, "in_service": s.in_service, "requests": s.requests, "failures": s.failures,
                 "retried_elsewhere": s.retried_elsewhere} for s in self.servers]

    async def stats(self) -> dict[str, float]:
        """This client's counts, the servers and those in service (each server's own: `server_stats`)."""
        return {**self._counts, "servers": len(self.servers),
                "servers_in_service": sum(s.in_service for s in self.servers)}

    async def aclose(self) -> None:
        await self.client.aclose()

    def shutdown(self) -> None:
        """Close the connections (the servers keep running)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.client.aclose())
        else:  # inside a loop: closed when the loop gets to it
            asyncio.ensure_future(self.client.aclose())
