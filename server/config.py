"""How the service runs: `ServerConfig`, which `gatehead serve` fills from flags and the environment."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gatehead.agent import AgentConfig
from gatehead.retrieval.config import StoreConfig
from gatehead.runtime.canary import CanaryConfig
from gatehead.runtime.engine import EngineConfig
from gatehead.runtime.guard import GuardConfig


@dataclass(frozen=True)
class ServerConfig:
    """The engine to start, the store and threads it serves from, and the service's own limits."""

    engine: EngineConfig  # needs a gate adapter: the agent and /v1/gate gate on it
    # `vllm serve` servers started with `gatehead vllm-args` on engine.model and engine.adapter: the service runs on
    # them (`RemoteEngine`) instead of starting an engine in its process; engine's other fields then go unused.
    vllm_urls: tuple[str, ...] = ()
    vllm_api_key: str | None = None  # their --api-key, if they were started with one
    store: StoreConfig = field(default_factory=StoreConfig)
    corpus: tuple[str | Path, ...] = ()  # ingested into the store at start (`gatehead serve`'s default: the demo's)
    threads: str | None = None  # SQLite path or postgres:// URL; default: threads.sqlite next to the store
    api_keys: tuple[str, ...] = ()  # none: the server runs open (and says so at startup)
    cors_origins: tuple[str, ...] = ()  # none: no cross-origin requests
    max_body_bytes: int = 1 << 20
    max_inflight: int = 32  # requests in flight beyond which new ones are shed (503)
    request_timeout: float | None = None  # seconds; a client may ask for less with X-Gatehead-Timeout
    drain_seconds: float = 30.0  # on SIGTERM: how long in-flight requests may take to finish
    base_model_name: str | None = None  # the plain-generation model's id; default: the model directory's name
    agent: AgentConfig = field(default_factory=AgentConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)  # the degenerate-output guard on every generation
    canary: CanaryConfig = field(default_factory=CanaryConfig)  # known-answer requests that watch the engine

    def __post_init__(self) -> None:
        if self.engine.adapter is None:
            raise ValueError("the service gates every agent turn: give the engine a gate adapter")
        if any(not k or k != k.strip() for k in self.api_keys):
            raise ValueError("API keys must be non-empty and have no surrounding spaces")
        for name in ("max_body_bytes", "max_inflight"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError(f"request_timeout must be > 0 seconds, got {self.request_timeout}")

    @property
    def base_name(self) -> str:
        return self.base_model_name or Path(self.engine.model).resolve().name
