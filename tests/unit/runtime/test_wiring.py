"""The engine-to-worker contract: what the engine writes into hf_overrides is what the worker reads back."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gatehead.runtime.checks import unsupported_args
from gatehead.runtime.wiring import KEY, Wiring


def test_the_wiring_round_trips_through_hf_overrides_as_json() -> None:
    wiring = Wiring(adapter="/abs/adapter", suffix_ids=(5, 6, 49152), action_ids=(49153, 49154, 49155),
                    max_gate_tokens=2048, tap="perturbed", branch="suffix-only")
    overrides = json.loads(json.dumps(wiring.overrides("GatedLlamaForCausalLM")))  # as `vllm serve` takes it
    assert overrides["architectures"] == ["GatedLlamaForCausalLM"] and set(overrides) == {"architectures", KEY}
    hf_config = SimpleNamespace(**{KEY: overrides[KEY]})
    assert Wiring.of(hf_config) == wiring
    with pytest.raises(ValueError, match="without gatehead's wiring"):
        Wiring.of(SimpleNamespace())


def test_unsupported_engine_arguments_are_refused_before_start() -> None:
    unsupported_args({"pipeline_parallel_size": 1})
    with pytest.raises(ValueError, match=r"speculative decoding .* pipeline parallelism"):
        unsupported_args({"speculative_config": {"method": "ngram"}, "pipeline_parallel_size": 2})
