"""The engines' CPU set-up: which cores vLLM's workers are bound to, and what a server started apart gets."""

from __future__ import annotations

import os

import pytest

from gatehead.runtime import cpu_setup
from gatehead.runtime.cpu_setup import BIND, CORES, binding, cores_of, cpu_set_up, engine_ranks
from gatehead.runtime.vllm_serve import ServeCommand


@pytest.fixture
def host(monkeypatch):
    """`host(n)`: a host of n physical cores (one logical CPU each, ids 0..n-1, this process allowed on all), with
    no binding or core list in the environment and the set-up on (an x86 CPU, preloads left out)."""
    monkeypatch.delenv(BIND, raising=False)
    monkeypatch.delenv(CORES, raising=False)
    monkeypatch.setattr(cpu_setup, "_x86_cpu", lambda: True)
    monkeypatch.setattr(cpu_setup, "libraries", lambda: [])

    def cores(n: int, layout_multiprocess: bool = True) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))
        monkeypatch.setattr(cpu_setup, "physical_cores", lambda: list(range(n)))
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if layout_multiprocess else "0")

    return cores


def test_cores_parse_as_vllm_writes_them_and_bad_lists_say_so() -> None:
    assert cores_of("0-3") == [0, 1, 2, 3] and cores_of("0,2-3") == [0, 2, 3] and cores_of("5") == [5]
    for bad in ("", "a", "3-1", "0,,1", "-1"):
        with pytest.raises(ValueError, match="is not a list of cores"):
            cores_of(bad)


def test_a_small_host_gives_the_workers_every_core_split_between_ranks(host) -> None:
    host(2)
    assert binding() == "0,1"  # vLLM's own would bind one core and keep the other for its polling scheduler
    assert binding(2) == "0|1"
    assert binding(3) == "0|1|0"  # more ranks than cores: a core each, shared
    assert binding(None) is None  # data parallelism: vLLM cuts the mask per rank itself
    host(3)
    assert binding(2) == "0|1,2"


def test_the_ranks_of_an_engine_are_its_local_workers_and_data_parallelism_is_left_to_vllm() -> None:
    assert engine_ranks({}) == 1 and engine_ranks({"tensor_parallel_size": 2}) == 2
    assert engine_ranks({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    assert engine_ranks({"data_parallel_size": 2}) is None and engine_ranks({"data_parallel_size": 1}) == 1


def test_a_big_host_keeps_vllms_binding_unless_cores_are_named(host, monkeypatch) -> None:
    host(cpu_setup.RESERVE_FROM)
    assert binding() is None
    monkeypatch.setenv(CORES, "2-3")
    assert binding() == "2,3" and binding(2) == "2|3"


def test_a_binding_already_given_is_left_alone_and_bad_core_lists_are_errors(host, monkeypatch) -> None:
    host(2)
    monkeypatch.setenv(BIND, "auto")
    assert binding() is None
    monkeypatch.delenv(BIND)
    monkeypatch.setenv(CORES, "zero")
    with pytest.raises(ValueError, match=f"{CORES}: 'zero' is not a list of cores"):
        binding()
    monkeypatch.setenv(CORES, "1-2")
    with pytest.raises(ValueError, match=r"CPUs \[2\] are not among those this process may run on \(\[0, 1\]\)"):
        binding()


def test_the_set_up_binds_while_an_engine_starts_and_restores_after(host) -> None:
    host(2)
    with cpu_set_up(2) as done:
        assert os.environ[BIND] == "0|1" and done.binding == "0|1" and done.libraries == ()
        assert "cores 0|1" in done.describe()
    assert BIND not in os.environ
    assert cpu_setup.environment() == {BIND: "0,1"} and BIND not in os.environ
    host(2, layout_multiprocess=False)  # the in-process layout: one rank runs in this process, unbound by vLLM
    with cpu_set_up() as done:
        assert done.binding is None and BIND not in os.environ and done.describe() == ""
    with cpu_set_up(2) as done:  # but tensor-parallel ranks are worker processes vLLM binds
        assert done.binding == "0|1" == os.environ[BIND]


def test_a_server_started_apart_gets_the_set_up_for_its_ranks(host) -> None:
    host(2)
    for flags, ranks in ((["m"], 1), (["m", "--tensor-parallel-size", "2"], 2), (["m", "-tp", "2"], 2),
                         (["m", "--tensor-parallel-size=2"], 2), (["m", "--tensor_parallel_size", "2"], 2),
                         (["m", "-tp", "2", "-pp", "2"], 4), (["m", "--data-parallel-size", "2"], None),
                         (["m", "--tensor-parallel-size"], 1)):
        command = ServeCommand(flags, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "m")
        assert command.engine_ranks() == ranks, flags
        env = command.process_environment()
        assert env.get(BIND) == {1: "0,1", 2: "0|1", 4: "0|1|0|1", None: None}[ranks]
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
