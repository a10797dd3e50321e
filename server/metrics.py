"""The service's Prometheus metrics, in a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gatehead.agent.state import Outcome

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_PROBABILITY = tuple(i / 10 for i in range(1, 11))
_ENGINE = {"running": "requests running in the engine", "waiting": "requests waiting in the engine's queue",
           "kv_cache_usage": "fraction of KV-cache blocks in use", "kv_blocks": "KV-cache blocks allocated",
           "gate_requests": "gate requests submitted", "generation_requests": "generation requests submitted",
           "prefix_cache_hits": "prompt tokens read from the prefix cache",
           "prefix_cache_queries": "prompt tokens looked up in the prefix cache",
           "prompt_tokens_computed": "prompt tokens prefilled, not read from the prefix cache",
           "generation_tokens": "tokens sampled, a gate's one token included",
           "branch_ms_per_step": "mean milliseconds per step spent in the gate branch"}

_SERVER = {"in_service": "1 while the server is in service, 0 once a health check or connection failed",
           "requests": "requests sent to the server", "failures": "connections to the server refused or broken",
           "retried_elsewhere": "requests retried on another server after this one failed"}


class Metrics:
    def __init__(self) -> None:
        from gatehead.runtime.guard import REASONS

        self.registry = registry = CollectorRegistry()
        self.requests = Counter("gatehead_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=registry)
        self.latency = Histogram("gatehead_request_seconds", "HTTP request latency", ["route"], buckets=_LATENCY,
                                 registry=registry)
        self.ttft = Histogram("gatehead_time_to_first_token_seconds", "time to the answer's first token",
                              buckets=_LATENCY, registry=registry)
        self.decisions = Counter("gatehead_gate_decisions", "gate decisions", ["decision"], registry=registry)
        self.probability = Histogram("gatehead_gate_probability", "gate probabilities by class", ["label"],
                                     buckets=_PROBABILITY, registry=registry)
        self.wasted_answer_tokens = Counter("gatehead_wasted_answer_tokens", "decode tokens of answers started "
                                            "beside their gate and aborted when it did not say answer",
                                            registry=registry)
        self.turns = Counter("gatehead_agent_turns", "agent turns by final decision", ["decision"], registry=registry)
        for outcome in get_args(Outcome):  # every decision shows, at 0 until a turn ends with it
            self.turns.labels(outcome)
        self.inflight = Gauge("gatehead_inflight_requests", "API requests in flight", registry=registry)
        self.shed = Counter("gatehead_shed_requests", "requests shed with 503 at the in-flight limit",
                            registry=registry)
        self.disconnects = Counter("gatehead_client_disconnects", "requests cancelled because the client went away",
                                   registry=registry)
        self.timeouts = Counter("gatehead_deadline_exceeded", "requests cancelled at their deadline",
                                registry=registry)
        self.degenerate = Counter("gatehead_degenerate_output", "generations the degenerate-output guard tripped "
                                  "on, by reason", ["reason"], registry=registry)
        self.guard_retries = Counter("gatehead_guard_retries", "generations retried with the prefix cache bypassed "
                                     "after a trip before any token was released", registry=registry)
        self.guard_ended = Counter("gatehead_guard_streams_ended", "generations ended with degenerate_output",
                                   registry=registry)
        for reason in REASONS:  # every reason shows, at 0 until it trips
            self.degenerate.labels(reason)
        self._guard_seen: dict[str, int] = {}
        self.canary_checks = Counter("gatehead_canary_checks", "canary checks run", registry=registry)
        self.canary_failed = Counter("gatehead_canary_failed_checks", "canary checks where a canary did not match "
                                     "its recording", registry=registry)
        self.canary_consecutive = Gauge("gatehead_canary_consecutive_failures", "failed canary checks in a row "
                                        "(the service is unready at the configured count)", registry=registry)
        self._canary_seen = (0, 0)
        self.engine_gauges = {name: Gauge(f"gatehead_engine_{name}", help_text, registry=registry)
                              for name, help_text in _ENGINE.items()}
        # Per vLLM server, where the service runs on them (`RemoteEngine.server_stats`).
        self.server_gauges = {name: Gauge(f"gatehead_vllm_server_{name}", help_text, ["server"], registry=registry)
                              for name, help_text in _SERVER.items()}

    def request(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def gate(self, decision: str, probs: Mapping[str, float]) -> None:
        self.decisions.labels(decision).inc()
        for label, p in probs.items():
            self.probability.labels(label).observe(p)

    def engine(self, stats: Mapping[str, float]) -> None:
        for name, gauge in self.engine_gauges.items():
            if name in stats:
                gauge.set(float(stats[name]))

    def servers(self, stats: list[Mapping]) -> None:
        for server in stats:
            for name, gauge in self.server_gauges.items():
                gauge.labels(server["url"]).set(float(server[name]))

    def guard(self, counters) -> None:
        """Bring the guard's counters (`gatehead.runtime.guard.GuardCounters`) up to date."""
        current = {**{f"trip:{r}": n for r, n in (counters.trips or {}).items()}, "retries": counters.retries,
                   "ended": counters.ended}
        for key, value in current.items():
            delta = value - self._guard_seen.get(key, 0)
            if delta > 0:
                if key.startswith("trip:"):
                    self.degenerate.labels(key.removeprefix("trip:")).inc(delta)
                else:
                    (self.guard_retries if key == "retries" else self.guard_ended).inc(delta)
            self._guard_seen[key] = value

    def canaries(self, state) -> None:
        """Bring the canary counters up to date from `gatehead.runtime.canary.CanaryState`."""
        checks, failed = self._canary_seen
        self.canary_checks.inc(state.checks - checks)
        self.canary_failed.inc(state.failed_checks - failed)
        self._canary_seen = (state.checks, state.failed_checks)
        self.canary_consecutive.set(state.consecutive)

    def render(self) -> bytes:
        return generate_latest(self.registry)
