"""`gatehead serve`'s settings (cli/settings.py): flags, the environment and engine arguments, no engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gatehead.cli import build_parser
from gatehead.cli.serve import engine_args as serve_engine_args
from gatehead.cli.settings import SERVE, SERVE_VARIABLES, apply_environment

GATEHEAD = str(Path(sys.executable).parent / "gatehead")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GATEHEAD, *args], capture_output=True, text=True, env=env, timeout=120)


def test_serve_takes_every_option_from_the_environment_flags_win(monkeypatch) -> None:
    def serve(*flags: str):
        return apply_environment(build_parser().parse_args(["serve", *flags]), SERVE)

    for name, value in (("PORT", "9001"), ("HOST", "0.0.0.0"), ("CORS_ORIGIN", "http://a.test, http://b.test"),
                        ("COMPILE", "true"), ("THREADS", "postgresql://db/threads"), ("TIMEOUT", "2.5"),
                        ("URL", "http://qdrant:6333"), ("MAX_INFLIGHT", "8")):
        monkeypatch.setenv(f"GATEHEAD_{name}", value)
    args = serve()
    assert (args.port, args.host, args.cors_origin, args.compile) == (9001, "0.0.0.0",
                                                                      ["http://a.test", "http://b.test"], True)
    assert (args.threads, args.timeout, args.url, args.max_inflight) == ("postgresql://db/threads", 2.5,
                                                                         "http://qdrant:6333", 8)
    flags = serve("--port", "9002", "--cors-origin", "http://c.test", "--store", "/data/q")
    assert (flags.port, flags.cors_origin, flags.store, flags.url) == (9002, ["http://c.test"], "/data/q", None)
    monkeypatch.setenv("GATEHEAD_PORT", "eighty")
    assert build_parser().parse_args(["ingest", "x"]).paths == ["x"]  # other commands ignore the variables
    with pytest.raises(ValueError, match="GATEHEAD_PORT"):
        serve()
    monkeypatch.setenv("GATEHEAD_PORT", "9001")
    monkeypatch.setenv("GATEHEAD_STORE", "/data/qdrant")
    result = run("serve", env=dict(os.environ))
    assert result.returncode == 2 and "not both" in result.stderr


def test_serve_passes_engine_arguments_through() -> None:
    def engine_args(*flags: str) -> dict:
        return serve_engine_args(build_parser().parse_args(["serve", *flags]))

    assert engine_args() == {}
    flags = ["--tensor-parallel-size", "2", "--engine-arg", "distributed_executor_backend=ray",
             "--engine-arg", "max_num_seqs=64", "--engine-arg", 'override_generation_config={"top_k": 5}']
    assert engine_args(*flags) == {"tensor_parallel_size": 2, "distributed_executor_backend": "ray",
                                   "max_num_seqs": 64, "override_generation_config": {"top_k": 5}}
    for bad in (["--engine-arg", "max_num_seqs"], ["--engine-arg", "not a name=1"], ["--tensor-parallel-size", "0"]):
        with pytest.raises(SystemExit, match="engine-arg|tensor-parallel-size"):
            engine_args(*bad)


def test_every_serve_setting_is_a_flag_and_a_variable() -> None:
    parsed = vars(build_parser().parse_args(["serve"]))
    assert all(parsed[s.dest] == (False if s.type is None else s.default) for s in SERVE)
    assert {"GATEHEAD_MAX_INFLIGHT", "GATEHEAD_URL", "GATEHEAD_API_KEYS", "GATEHEAD_MODEL"} <= SERVE_VARIABLES
    assert "GATEHEAD_API_KEY" not in SERVE_VARIABLES  # the keys' variable is GATEHEAD_API_KEYS
    args = apply_environment(build_parser().parse_args(["serve"]), SERVE, {"GATEHEAD_NO_GUARD": "yes"})
    assert args.no_guard is True
    with pytest.raises(ValueError, match="GATEHEAD_NO_GUARD='maybe': use 1/true/yes or 0/false/no"):
        apply_environment(build_parser().parse_args(["serve"]), SERVE, {"GATEHEAD_NO_GUARD": "maybe"})
