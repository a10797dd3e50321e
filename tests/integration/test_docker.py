"""The container images and the compose stack, checked without a Docker engine (none runs here).

hadolint lints the Dockerfiles and check-jsonschema validates compose.yaml against the compose
specification's schema; both are shown to fail on a broken file first, so a green run means
something. The images' entrypoint is the `gatehead serve` the server tests run, every GATEHEAD_*
setting in them is one that command reads, and the installed package carries the demo kit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from gatehead.cli import build_parser
from gatehead.cli.settings import SERVE_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
BIN = Path(sys.executable).parent
DOCKERFILES = ["Dockerfile.cpu", "Dockerfile.gpu"]


def lint(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=120)


def test_hadolint_passes_the_dockerfiles_and_catches_a_bad_one(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install curl\nCMD gatehead serve\n")
    caught = lint("hadolint", str(bad))
    assert caught.returncode != 0 and "DL3007" in caught.stdout  # the :latest tag
    result = lint("hadolint", *(str(DOCKER / name) for name in DOCKERFILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_file_matches_the_compose_spec_and_a_typo_fails(tmp_path: Path) -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    typo = tmp_path / "compose.yaml"
    compose_typo = json.loads(json.dumps(compose))
    compose_typo["services"]["postgres"]["healthcheck"]["intervall"] = "5s"
    typo.write_text(yaml.safe_dump(compose_typo))
    assert lint("check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(typo)).returncode != 0
    result = lint("check-jsonschema", "--builtin-schema", "vendor.compose-spec", str(DOCKER / "compose.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_images_run_gatehead_serve_configured_by_variables_it_reads() -> None:
    # GATEHEAD_CACHE is the demo kit's (where the image builds the demo model), read by gatehead.demo.cache_root.
    assert 'os.environ.get("GATEHEAD_CACHE")' in (ROOT / "demo" / "__init__.py").read_text()
    known = SERVE_VARIABLES | {"GATEHEAD_CACHE"}
    for name in DOCKERFILES:
        lines = [line.strip() for line in (DOCKER / name).read_text().splitlines()]
        assert 'ENTRYPOINT ["gatehead", "serve"]' in lines, name
        assert any("/readyz" in line for line in lines if line.startswith("CMD") or "HEALTHCHECK" in line), name
        env = {word.split("=")[0] for line in lines for word in line.replace("\\", "").split()
               if word.startswith("GATEHEAD_") and "=" in word}
        assert env and env <= known, (name, env - known)
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    replicas = [name for name in services if name.startswith("gatehead-")]
    assert len(replicas) >= 2  # behind the balancer, sharing Qdrant and PostgreSQL
    for name in replicas:
        assert set(services[name]["environment"]) <= known
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])
        assert services[name]["environment"]["GATEHEAD_THREADS"].startswith("postgresql://")
        assert services[name]["environment"]["GATEHEAD_URL"] == "http://qdrant:6333"
    assert len({services[name]["volumes"][0] for name in replicas}) == len(replicas)  # no shared embedded state
    assert all("healthcheck" in services[name] for name in ("qdrant", "postgres", "balancer", *replicas))
    nginx = (DOCKER / "nginx.conf").read_text()
    assert all(f"server {name}:8000" in nginx for name in replicas)
    assert set(services["balancer"]["depends_on"]) == set(replicas)
    ingest = services["ingest"]
    build_parser().parse_args([ingest["entrypoint"][1], *ingest["command"]])  # flags `gatehead ingest` takes
    # The `vllm` profile: `gatehead serve-vllm` in the image, and gatehead on it through --vllm-url.
    vllm, agent = services["vllm"], services["agent-on-vllm"]
    assert vllm["profiles"] == agent["profiles"] == ["vllm"] and vllm["image"] == agent["image"] == "gatehead:cpu"
    served = build_parser().parse_args([vllm["entrypoint"][1], *vllm["command"]])
    assert "/health" in " ".join(vllm["healthcheck"]["test"]) and str(served.port) in " ".join(
        vllm["healthcheck"]["test"])
    assert set(agent["environment"]) <= known and agent["environment"]["GATEHEAD_VLLM_URL"] == \
        f"http://vllm:{served.port}"
    assert agent["depends_on"]["vllm"]["condition"] == "service_healthy"


@pytest.mark.parametrize("part", ["gatehead/demo/generator/adapter_config.json",
                                  "gatehead/demo/adapter/adapter_config.json", "gatehead/demo/adapter-suffix/gate.json",
                                  "gatehead/demo/corpus/orders/bs-370.md", "gatehead/server/static/chat.js"])
def test_an_installed_package_carries_the_demo_kit_and_the_chat_page(part: str, wheel: set[str]) -> None:
    assert part in wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> set[str]:
    out, tree = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("tree") / "gatehead"
    # From a clean copy of the tree: an in-tree build/ left by an earlier build would hide missing package data.
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", ".cache", "build", "dist",
                                                              "*.egg-info", "eval-runs", "__pycache__"))
    subprocess.run([str(BIN / "pip"), "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree)],
                   check=True, capture_output=True, timeout=300)
    [built] = out.glob("gatehead-*.whl")
    with zipfile.ZipFile(built) as archive:
        return set(archive.namelist())
