"""Engine statistics, gathered from vLLM's own per-step stats through a stat logger of gatehead's.

vLLM's Prometheus metrics live in one process-wide registry, which several engines in one process
overwrite; this logger belongs to one engine and only accumulates. It reads vLLM's step stats; it
does not measure anything itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class EngineStats:
    """Counters since the engine started, and the latest scheduler gauges."""

    steps: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found there
    preemptions: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    gate_requests: int = 0  # counted by SharedEngine
    generation_requests: int = 0
    # Prompt tokens prefilled, not read from the prefix cache: vLLM counts them once per request, with its first
    # token (a preempted request's recomputation is not counted again).
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0  # tokens sampled (a gate's one token included)

    def snapshot(self) -> dict[str, float]:
        return asdict(self)


def stat_logger_factory(stats: EngineStats):
    """A vLLM `StatLoggerFactory` whose loggers add every step's stats to `stats`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                stats.steps += 1
                stats.running, stats.waiting = scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs
                stats.kv_cache_usage = scheduler_stats.kv_cache_usage
                stats.prefix_cache_queries += scheduler_stats.prefix_cache_stats.queries
                stats.prefix_cache_hits += scheduler_stats.prefix_cache_stats.hits
            if iteration_stats is not None:
                stats.preemptions += iteration_stats.num_preempted_reqs
                stats.prompt_tokens_computed += iteration_stats.prompt_token_stats.computed
                stats.generation_tokens += iteration_stats.num_generation_tokens

        def log_engine_initialized(self) -> None:
            pass

    return _Logger
