"""The engines' CPU set-up: which cores vLLM's workers are bound to, and what a server started apart gets."""

from __future__ import annotations

import os

import pytest

from gatehead.runtime import cpu_setup
from gatehead.runtime.cpu_setup import BIND, CORES, binding, cores_of, cpu_set_up
from gatehead.runtime.vllm_serve import ServeCommand


@pytest.fixture
def host(monkeypatch):
    """A host of `n` cores (this process's affinity), with no binding or core list in the environment."""
    monkeypatch.delenv(BIND, raising=False)
    monkeypatch.delenv(CORES, raising=False)

    def cores(n: int) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(n)))

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
    host(3)
    assert binding(2) == "0|1,2"


def test_a_big_host_keeps_vllms_binding_unless_cores_are_named(host, monkeypatch) -> None:
    host(cpu_setup.RESERVE_FROM)
    assert binding() is None
    monkeypatch.setenv(CORES, "2-3")
    assert binding() == "2,3" and binding(2) == "2|3"


def test_a_binding_already_given_is_left_alone_and_a_bad_core_list_is_an_error(host, monkeypatch) -> None:
    host(2)
    monkeypatch.setenv(BIND, "auto")
    assert binding() is None
    monkeypatch.delenv(BIND)
    monkeypatch.setenv(CORES, "zero")
    with pytest.raises(ValueError, match=f"{CORES}: 'zero' is not a list of cores"):
        binding()


def test_the_set_up_binds_while_an_engine_starts_and_restores_after(host, monkeypatch) -> None:
    host(2)
    monkeypatch.setattr(cpu_setup, "enabled", lambda: True)
    monkeypatch.setattr(cpu_setup, "libraries", lambda: [])
    with cpu_set_up(2) as done:
        assert os.environ[BIND] == "0|1" and done.binding == "0|1" and done.libraries == ()
        assert "cores 0|1" in done.describe()
    assert BIND not in os.environ
    assert cpu_setup.environment() == {BIND: "0,1"} and BIND not in os.environ
    monkeypatch.setattr(cpu_setup, "enabled", lambda: False)  # the in-process layout, or GATEHEAD_CPU_PRELOAD=0
    with cpu_set_up() as done:
        assert done.binding is None and BIND not in os.environ and done.describe() == ""


def test_a_server_started_apart_gets_the_set_up_for_its_tensor_parallel_size(host, monkeypatch) -> None:
    host(2)
    monkeypatch.setattr(cpu_setup, "enabled", lambda: True)
    monkeypatch.setattr(cpu_setup, "libraries", lambda: [])
    for flags, size in ((["m"], 1), (["m", "--tensor-parallel-size", "2"], 2), (["m", "-tp", "2"], 2),
                        (["m", "--tensor-parallel-size=2"], 2)):
        command = ServeCommand(flags, {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "m")
        assert command.tensor_parallel() == size
        env = command.process_environment()
        assert env[BIND] == ("0,1" if size == 1 else "0|1") and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
