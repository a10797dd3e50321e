"""The gate's rules where vLLM admits requests (`gatehead.runtime.frontend`), the `vllm serve` flags
(`gatehead.runtime.vllm_serve`), and what a failed gate row puts in the logits: on plain objects, no engine."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from gatehead.runtime.frontend import GateRules, admission_hook
from gatehead.runtime.gated import GateState
from gatehead.runtime.plugin import GATE_FLAG, SUFFIX_FLAG
from gatehead.runtime.vllm_serve import ServeCommand, engine_flags

SUFFIX = (7, 8, 99)  # 99: the reserved gate token
ACTIONS = (100, 101, 102)


def rules(suffix_mode: bool) -> GateRules:
    return GateRules(SUFFIX, frozenset(ACTIONS) | {99}, max_gate_tokens=12, suffix_mode=suffix_mode)


def request(ids, gate: bool = False, suffix: int | None = None, pooling: bool = False):
    extra = {GATE_FLAG: "gate", **({SUFFIX_FLAG: suffix} if suffix is not None else {})} if gate else None
    params = None if pooling else SimpleNamespace(extra_args=extra, skip_reading_prefix_cache=False)
    return SimpleNamespace(prompt_token_ids=ids, sampling_params=params)


def refused(rule: GateRules, req) -> str:
    from vllm.exceptions import VLLMValidationError

    with pytest.raises(VLLMValidationError) as caught:
        rule.admit(req)
    return str(caught.value)


def test_a_prompt_mode_gate_is_admitted_and_made_to_compute_every_row() -> None:
    req = request([1, 2, 3, *SUFFIX], gate=True)
    rules(False).admit(req)
    assert req.sampling_params.skip_reading_prefix_cache is True


def test_a_suffix_mode_gate_names_its_suffix_length_and_may_read_the_cache() -> None:
    req = request([1, 2, 3, *SUFFIX], gate=True, suffix=3)
    rules(True).admit(req)
    assert req.sampling_params.skip_reading_prefix_cache is False
    for wrong in (None, 2, 4):
        assert "names its suffix length" in refused(rules(True), request([1, 2, *SUFFIX], gate=True, suffix=wrong))


@pytest.mark.parametrize("ids, reason", [
    ([1, 2, 3], "must end with the adapter's invocation suffix"),
    ([1, 100, 3, *SUFFIX], "no reserved gate token before its suffix"),
    ([1, 99, 3, *SUFFIX], "no reserved gate token before its suffix"),
    (list(range(10)) + list(SUFFIX), "over the engine's max_gate_tokens=12"),
])
def test_gate_prompts_that_break_the_layout_are_refused(ids, reason) -> None:
    assert reason in refused(rules(False), request(ids, gate=True))


def test_every_problem_of_a_gate_prompt_is_named_at_once() -> None:
    message = refused(rules(True), request([100, 1, 2, 5], gate=True))
    assert "invocation suffix" in message and "reserved gate token" in message and "suffix length" in message


@pytest.mark.parametrize("token", [99, *ACTIONS])
def test_generation_prompts_may_not_carry_a_reserved_token(token) -> None:
    assert "reserved tokens" in refused(rules(False), request([1, token, 2]))
    rules(False).admit(request([1, 7, 8, 2]))  # the suffix's ordinary tokens are ordinary text


def test_prompt_embeddings_are_refused_and_pooling_requests_pass() -> None:
    assert "prompt embeddings" in refused(rules(False), request(None))
    rules(False).admit(request([1, 100], pooling=True))


def test_an_engine_without_gateheads_wiring_has_no_rules() -> None:
    assert GateRules.of(SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace()))) is None


def test_the_admission_hook_follows_the_gate_mode() -> None:
    assert admission_hook(False) == "gatehead.runtime.admission:GateAdmission"
    assert admission_hook(True) == "gatehead.runtime.admission:SuffixGateAdmission"


def test_engine_arguments_become_vllm_serve_flags_that_vllms_parser_reads_back() -> None:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = {"model": "/m", "dtype": "float32", "max_model_len": 1024, "seed": 0, "enforce_eager": True,
            "enable_prefix_caching": False, "disable_log_stats": False, "scheduling_policy": "priority",
            "hf_overrides": {"architectures": ["GatedLlamaForCausalLM"], "gatehead_wiring": {"suffix_ids": [1, 2]}},
            "logits_processors": [admission_hook(True)], "kv_cache_memory_bytes": 1 << 27, "block_size": 32,
            "worker_extension_cls": "gatehead.runtime.plugin.WorkerExtension"}
    flags = engine_flags(args)
    assert flags[0] == "/m" and "--disable-log-stats" not in flags
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args([*flags[1:], "--model", flags[0]])
    engine = AsyncEngineArgs.from_cli_args(parsed)
    for name, value in args.items():
        if name != "disable_log_stats":
            assert getattr(engine, name) == value, name
    command = ServeCommand(flags, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "m+gate-0")
    assert command.shell().startswith("VLLM_USE_V2_MODEL_RUNNER=0 vllm serve /m --dtype float32")
    assert "'" + json.dumps(args["hf_overrides"], separators=(",", ":")) + "'" in command.shell()
    assert command.module_argv("py")[:5] == ["py", "-m", "vllm.entrypoints.launchers.api_server.entry", "--model",
                                             "/m"]


def test_a_failed_gate_row_is_finite_and_no_action_is_possible() -> None:
    """NaN logits would reach vLLM's HTTP response, which cannot render them (a misleading 400): a failed row puts
    every action at -inf and its probability on one other token."""
    state = SimpleNamespace(results={0: None, 2: torch.tensor([1.0, 2.0, 3.0])}, action_ids=torch.tensor([4, 5, 6]),
                            failed_token=0)
    logits = GateState.apply(state, torch.randn(3, 8))
    logprobs = torch.log_softmax(logits, dim=-1)
    assert torch.isfinite(logprobs[0, 0]) and torch.isinf(logprobs[0, 4:7]).all() and not logprobs.isnan().any()
    assert torch.allclose(logprobs[2, 4:7].exp().sum(), torch.tensor(1.0))
    assert state.results == {}
