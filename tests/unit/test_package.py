"""Packaging and layout: one `gatehead` namespace, imports only through it, nothing heavy at import."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import gatehead

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("agent", "cli", "demo", "evals", "figures", "gate", "retrieval", "runtime", "server")
HEAVY = ("torch", "transformers", "peft", "vllm", "tokenizers", "safetensors")


def python_files() -> list[Path]:
    skip = {".venv", ".cache", "build", "dist", ".git"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def test_code_imports_only_through_gatehead() -> None:
    offenders = []
    for path in python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} relative import")
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} import {n}"
                          for n in names if n.split(".")[0] in SUBPACKAGES + ("tests",)]
    assert offenders == [], "import through `gatehead.` instead:\n" + "\n".join(offenders)


def test_ruff_is_clean() -> None:
    result = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_editable_install_maps_the_repo_root_to_gatehead() -> None:
    from gatehead import runtime

    assert Path(gatehead.__file__).resolve() == ROOT / "__init__.py"
    assert Path(runtime.__file__).resolve() == ROOT / "runtime" / "__init__.py"


# The modules vLLM loads inside its engine processes: they are torch and vLLM code by nature.
ENGINE_SIDE = {"gatehead.runtime.gated", "gatehead.runtime.branch", "gatehead.runtime.tap",
               "gatehead.runtime.admission", "gatehead.runtime.paged_kv"}
# Scripts run by hand on a CUDA machine with PyTorch alone: torch is what they measure.
TORCH_SCRIPTS = {"gatehead.benchmarks.gpu_branch", "gatehead.benchmarks.cuda_paths"}


def test_nothing_heavy_is_imported_at_import_time() -> None:
    code = (
        "import importlib, pkgutil, sys, json, gatehead\n"
        "mods = [m.name for m in pkgutil.walk_packages(gatehead.__path__, 'gatehead.')]\n"
        f"light = [m for m in mods if m not in {sorted(ENGINE_SIDE | TORCH_SCRIPTS)!r}]\n"
        "[importlib.import_module(m) for m in light]\n"
        f"print(json.dumps([mods, [h for h in {HEAVY!r} if h in sys.modules]]))\n"
    )
    # Without the tests' CPU ISA emulation (GATEHEAD_TEST_CPU_ISA), whose sitecustomize imports torch itself.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GATEHEAD_TEST_CPU_ISA")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True, env=env)
    modules, heavy = json.loads(result.stdout)
    assert "gatehead.runtime.engine" in modules and ENGINE_SIDE | TORCH_SCRIPTS <= set(modules)
    assert "gatehead.benchmarks.side_by_side" in modules
    assert heavy == []


def test_wheel_installs_the_same_namespace(tmp_path: Path) -> None:
    # setuptools copies into build/lib and reuses what an earlier build left there (modules since moved)
    for stale in (ROOT / "build").glob("lib*"):
        shutil.rmtree(stale)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("gatehead-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.removeprefix("gatehead/") for n in names if n.endswith(".py")}
    tree = {p.relative_to(ROOT).as_posix() for p in python_files() if p.relative_to(ROOT).parts[0] != "tests"}
    assert shipped == tree, f"only in the wheel: {sorted(shipped - tree)}; only in the tree: {sorted(tree - shipped)}"
    packages = [p.parent.relative_to(ROOT).as_posix() for p in python_files()
                if p.name == "__init__.py" and p.parent != ROOT and p.relative_to(ROOT).parts[0] != "tests"]
    assert set(SUBPACKAGES) <= set(packages) and "server/routers" in packages
    missing = [f"gatehead/{package}/" for package in packages if f"gatehead/{package}/__init__.py" not in names]
    assert missing == [], f"pyproject.toml's packages leave out {missing}"
    assert "gatehead/cli/__main__.py" in names and "gatehead/gate/reference.py" in names
    assert not [n for n in names if n.startswith(("tests/", "gatehead/tests/"))]
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    code = "import gatehead.gate.policy as p, gatehead; print(gatehead.__file__); print(p.decide.__name__)"
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                         check=True)
    assert out.stdout.splitlines() == [str(target / "gatehead" / "__init__.py"), "decide"]


def test_the_readmes_architecture_table_names_every_module() -> None:
    """Every folder of the package has a row, and every module in it is named there (top-level modules in
    the `top level` row), so the table cannot fall behind the tree."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Architecture"):]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| folder") and not line.startswith("| ---"):
            name, modules = (cell.strip() for cell in line.strip("|").split("|", 1))
            rows[name.strip("`")] = modules
    missing = []
    for package in (*SUBPACKAGES, "benchmarks"):
        row = rows.get(f"{package}/")
        if row is None:
            missing.append(f"{package}/ (no row)")
            continue
        missing += [f"{package}/{m.name}" for m in sorted((ROOT / package).glob("*.py"))
                    if m.name != "__init__.py" and f"`{m.name}`" not in row]
    missing += [m.name for m in sorted(ROOT.glob("*.py")) if m.name != "__init__.py"
                and f"`{m.name}`" not in rows.get("top level", "")]
    assert missing == [], f"the README's architecture table does not name: {missing}"


LAYERS = {  # package: the packages it must not import (at module level or inside a function)
    "gate": ("runtime", "agent", "server", "demo", "cli"),
    "runtime": ("agent", "server", "demo", "cli"),
    "retrieval": ("runtime", "agent", "server", "demo", "cli"),
    "agent": ("server", "demo", "cli"),
    "server": ("demo", "cli"),
    # The floors around the request path: the CLI is the top floor, imported by nothing but its entry point.
    "evals": ("cli", "server"),
    "demo": ("cli", "server"),
    "benchmarks": ("cli", "server"),
    "figures": ("cli", "server"),
}


def gatehead_imports(path: Path) -> list[tuple[int, str]]:
    """(line, subpackage) for every `gatehead.<subpackage>` a module imports, wherever the import sits."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("gatehead.") and n.count(".") >= 1]
        if isinstance(node, ast.ImportFrom) and node.module == "gatehead":  # from gatehead import demo
            found += [(node.lineno, a.name) for a in node.names]
    return found


def test_layers_import_downward_only() -> None:
    offenders = [f"{path.relative_to(ROOT)}:{line} imports gatehead.{sub}"
                 for package, banned in LAYERS.items() for path in sorted((ROOT / package).rglob("*.py"))
                 for line, sub in gatehead_imports(path) if sub in banned]
    assert offenders == [], "\n".join(offenders)


def test_the_layer_check_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from gatehead.demo import MODEL_DIR\n    import gatehead.agent.graph\n"
                      "from gatehead import server\n")
    assert sorted(gatehead_imports(module)) == [(2, "demo"), (3, "agent"), (4, "server")]


def _package_graph() -> dict[str, set[str]]:
    """{top-level package or module: the others it imports}, every import counted wherever it sits."""
    graph: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        skipped = rel.parts[0] in ("tests", "build", "docker", "docs") or rel.parts[0].startswith(".")
        if skipped or rel == Path("__init__.py"):
            continue
        me = rel.parts[0].removesuffix(".py")
        graph.setdefault(me, set()).update(sub for _, sub in gatehead_imports(path) if sub != me)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle among the packages (as a path that returns to its start), or []."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return []


def test_the_package_import_graph_has_no_cycle() -> None:
    graph = _package_graph()
    assert {"gate", "runtime", "agent", "demo", "evals", "cli"} <= set(graph)
    assert _cycle(graph) == [], " -> ".join(_cycle(graph))
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check sees a cycle


def test_the_agents_prompts_import_without_langgraph() -> None:
    """Training code reads the agent's prompt texts on machines that may lack LangGraph (a lent GPU machine)."""
    code = ("import sys; sys.modules['langgraph'] = None\n"
            "import gatehead.agent.prompts as p, gatehead.agent as a\n"
            "assert p.REFUSAL and 'gatehead.agent.graph' not in sys.modules\n"
            "try:\n    a.Agent\nexcept ImportError:\n    print('needs langgraph')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GATEHEAD_TEST_CPU_ISA")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=env)
    assert result.returncode == 0 and result.stdout.strip() == "needs langgraph", result.stderr[-2000:]


DATA_MODULES = {"demo/phrasings.py"}  # tables of phrasings: data, not logic


def test_no_module_over_500_lines_and_no_function_over_60() -> None:
    """The code reads in pieces a reader can hold: tests and data modules aside."""
    long_files, long_functions = [], []
    for path in sorted(python_files()):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("tests/") or rel in DATA_MODULES:
            continue
        text = path.read_text()
        if len(text.splitlines()) > 500:
            long_files.append(rel)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long_functions.append(f"{rel}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long_files == [] and long_functions == []


def test_the_unit_tier_mirrors_the_package_folders() -> None:
    """A unit test lives in the folder of the package it tests (tests/unit/<package>/); at the top only the
    top-level modules' tests."""
    unit = ROOT / "tests" / "unit"
    folders = sorted(p.name for p in unit.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    assert set(folders) <= {*SUBPACKAGES, "benchmarks"}
    assert set(SUBPACKAGES) <= set(folders), f"no unit tests folder for {sorted(set(SUBPACKAGES) - set(folders))}"
    top = sorted(p.stem.removeprefix("test_") for p in unit.glob("test_*.py"))
    assert all((ROOT / f"{name}.py").exists() or name == "package" for name in top), top


def test_every_name_imported_from_gatehead_exists() -> None:
    """Imports inside functions run only when called: a name moved to another module (as `fingerprint` once
    moved from provenance to digest, breaking a benchmark at its very end) is caught here, for every file."""
    wanted: set[tuple[str, str]] = set()
    for path in python_files():
        if "tests" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gatehead"):
                wanted |= {(node.module, a.name) for a in node.names if a.name != "*"}
    check = ("import importlib, json, sys\n"
             "missing = []\n"
             "for module, name in json.loads(sys.argv[1]):\n"
             "    found = importlib.import_module(module)\n"
             "    if not hasattr(found, name):\n"
             "        try:\n"
             "            importlib.import_module(f'{module}.{name}')\n"
             "        except ModuleNotFoundError:\n"
             "            missing.append(f'from {module} import {name}')\n"
             "print(json.dumps(missing))\n")
    result = subprocess.run([sys.executable, "-c", check, json.dumps(sorted(wanted))], capture_output=True,
                            text=True, cwd=ROOT.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
