"""`gatehead figures`' runner: envelopes, failures that keep the old file, sealed data, time limits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gatehead import figures
from gatehead.figures import Item, fingerprint, run_item, sealed_read

WRITE = "import json, sys; json.dump({'accuracy': 0.5, 'argv': sys.argv[1:]}, open(sys.argv[1], 'w'))"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A repository with a model folder to fingerprint."""
    repo = tmp_path / "repo"
    (repo / "m").mkdir(parents=True)
    (repo / "m" / "weights.bin").write_bytes(b"\x00\x01")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "m"],
                   check=True)
    return repo


def commit_all(repo: Path) -> None:
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "next"],
                   check=True)


def item(code: str = WRITE, **overrides) -> Item:
    base = dict(name="toy", about="a toy figure", minutes=0.05, argv=("{python}", "-c", code, "{out}"),
                results="file", fingerprints=(("model", "m"),))
    base.update(overrides)
    return Item(**base)


def test_a_finished_item_writes_its_envelope(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "figs"
    envelope = run_item(item(), out, root)
    assert json.loads((out / "toy.json").read_text()) == envelope
    assert envelope["results"]["accuracy"] == 0.5
    assert envelope["commit"] == subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                                text=True, check=True).stdout.strip()
    assert envelope["dirty"] is False and envelope["exit_code"] == 0
    assert envelope["fingerprints"] == {"model": fingerprint(root / "m")}
    # An earlier item's envelope and the ledger in the tree leave it clean; a changed source does not.
    (root / "docs" / "figures").mkdir(parents=True)
    (root / "docs" / "figures" / "other.json").write_text("{}")
    (root / "evals").mkdir()
    (root / "evals" / "demo-ledger.jsonl").write_text("{}\n")
    assert run_item(item(), out, root)["dirty"] is False
    (root / "m" / "weights.bin").write_bytes(b"\x00\x02")
    with pytest.raises(RuntimeError, match="uncommitted changes"):  # a figure measures a commit
        run_item(item(), out, root)
    assert json.loads((out / "toy.json").read_text())["dirty"] is False  # the earlier envelope stays
    assert run_item(item(), out, root, allow_dirty=True)["dirty"] is True  # recorded, where asked
    assert envelope["command"].startswith("python -c ") and envelope["command"].endswith(" OUT.json")
    assert envelope["machine"]["cpus"] >= 1 and envelope["machine"]["bf16"] in ("AMX", "AVX-512 BF16", "emulated")


def test_fingerprints_change_with_the_weights(root: Path) -> None:
    before = fingerprint(root / "m")
    (root / "m" / "weights.bin").write_bytes(b"\x00\x02")
    assert fingerprint(root / "m") != before
    with pytest.raises(FileNotFoundError):
        fingerprint(root / "m" / "missing")


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie awaiting its reaper counts as ended)."""
    for _ in range(50):
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.1)
    return False


def test_a_failure_keeps_the_earlier_file(root: Path, tmp_path: Path) -> None:
    out = tmp_path / "figs"
    run_item(item(), out, root)
    kept = (out / "toy.json").read_text()
    with pytest.raises(RuntimeError, match="exited 3"):
        run_item(item("import sys; sys.exit(3)"), out, root)
    with pytest.raises(RuntimeError, match="no readable results"):
        run_item(item("import sys; open(sys.argv[1], 'w').write('not json')"), out, root)
    # Past its limit, the item is stopped with every process it started (an engine's would hold cores).
    child = tmp_path / "child.pid"

    def spawning(then: str) -> str:
        return (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
                f"time.sleep(60)']); open({str(child)!r}, 'w').write(str(p.pid)); {then}")

    with pytest.raises(RuntimeError, match="past its limit"):
        run_item(item(spawning("time.sleep(30)"), limit_minutes=0.1), out, root)
    assert gone(int(child.read_text()))
    # And when it ends by itself, what it left running is stopped too.
    with pytest.raises(RuntimeError, match="exited 3"):
        run_item(item(spawning("sys.exit(3)")), out, root)
    assert gone(int(child.read_text()))
    assert (out / "toy.json").read_text() == kept
    # An exit code the item accepts (an eval's failed verdict) is still a figure.
    assert run_item(item(WRITE + "; sys.exit(1)", ok_codes=(0, 1)), out, root)["exit_code"] == 1


def test_sealed_data_is_read_once_per_model(root: Path, tmp_path: Path) -> None:
    out, sealed = tmp_path / "figs", item(sealed=True)
    assert not sealed_read(sealed, out, root)
    assert run_item(sealed, out, root)["reread"] is False
    assert sealed_read(sealed, out, root)
    with pytest.raises(RuntimeError, match="sealed held-out data"):
        run_item(sealed, out, root)
    assert run_item(sealed, out, root, reread=True)["reread"] is True
    (root / "m" / "weights.bin").write_bytes(b"new model")  # a new model may read it once, committed
    assert not sealed_read(sealed, out, root)
    with pytest.raises(RuntimeError, match="read once, on committed code only"):
        run_item(sealed, out, root, allow_dirty=True)
    commit_all(root)
    assert run_item(sealed, out, root)["reread"] is False


def test_a_reading_the_ledger_records_counts_as_the_first(root: Path, tmp_path: Path) -> None:
    """Any command that measured these weights on the test split (`demo.sealed.unseal`) made it read."""
    from gatehead.provenance import append_to_ledger

    out, sealed = tmp_path / "figs", item(sealed=True)
    other = {"kind": "sealed-read", "file": "demo/data/test.jsonl", "fingerprints": {"model": "sha-of-another"}}
    ours = {"model": fingerprint(root / "m")}
    append_to_ledger(root / figures.LEDGER, other)
    append_to_ledger(root / figures.LEDGER, {**other, "kind": "verdict", "fingerprints": ours})
    assert not sealed_read(sealed, out, root)  # another model's reading, or no reading at all
    append_to_ledger(root / figures.LEDGER, {**other, "fingerprints": ours})
    assert sealed_read(sealed, out, root)
    with pytest.raises(RuntimeError, match="sealed held-out data"):
        run_item(sealed, out, root)
    assert run_item(sealed, out, root, reread=True)["reread"] is True  # a development figure


def test_a_reading_of_the_model_built_from_the_fingerprinted_folder_counts(root: Path, tmp_path: Path) -> None:
    """The demo items fingerprint the committed generator and measure the model built from it: the ledger
    records the built model's fingerprint, and that reading is the item's."""
    from gatehead.provenance import append_to_ledger

    built = tmp_path / "built-model"
    built.mkdir()
    (built / "weights.bin").write_bytes(b"merged")
    out = tmp_path / "figs"
    sealed = item(sealed=True, measured_model=lambda build: built)
    unbuilt = item(sealed=True, measured_model=lambda build: built if build else None)
    reading = {"kind": "sealed-read", "file": "demo/data/test.jsonl", "fingerprints": {"model": fingerprint(built)}}
    assert not sealed_read(sealed, out, root)
    append_to_ledger(root / figures.LEDGER, reading)
    commit_all(root)
    assert sealed_read(sealed, out, root) and not sealed_read(unbuilt, out, root)
    assert sealed_read(unbuilt, out, root, build=True)
    with pytest.raises(RuntimeError, match="sealed held-out data"):
        run_item(unbuilt, out, root)  # run_item builds it to look


def test_logs_inside_the_repository_leave_it_clean(root: Path, tmp_path: Path) -> None:
    out = root / "figs"
    first = run_item(item(), out, root, log_dir=root / "logs")
    assert first["dirty"] is False and (root / "logs" / "toy.log").exists()
    assert run_item(item(), out, root, log_dir=root / "logs")["dirty"] is False  # its own outputs are not changes


def test_stdout_and_folder_results(root: Path, tmp_path: Path) -> None:
    printed = item("print('{\"x\": 1}')", argv=("{python}", "-c", "print('{\"x\": 1}')"), results="stdout")
    assert run_item(printed, tmp_path / "figs", root)["results"] == {"x": 1}
    folder = item(argv=("{python}", "-c", "import json, os, sys; os.makedirs(sys.argv[1]); "
                        "json.dump({'verdict': 'pass'}, open(os.path.join(sys.argv[1], 'result.json'), 'w'))", "{dir}"),
                  results="dir")
    assert run_item(folder, tmp_path / "figs", root)["results"] == {"verdict": "pass"}


def test_items_name_real_commands_and_the_cli_lists_them() -> None:
    names = [i.name for i in figures.ITEMS]
    assert len(names) == len(set(names))
    with pytest.raises(ValueError, match="unknown figures item"):
        figures.by_name(["no-such-item"])
    listed = subprocess.run([sys.executable, "-m", "gatehead.cli", "figures", "--list"], capture_output=True, text=True,
                            check=True).stdout
    for i in figures.ITEMS:
        assert i.name in listed and figures.shown(i) in listed
        assert all((figures.ROOT / path).exists() or path.startswith(".cache") for _, path in i.fingerprints)
    failed = subprocess.run([sys.executable, "-m", "gatehead.cli", "figures", "--only", "no-such-item"],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and "unknown figures item" in failed.stderr


def test_recorded_test_figures_reach_an_envelope_and_its_table(record_figure, monkeypatch, tmp_path: Path) -> None:
    """The fidelity items' path: a test's `record_figure` writes $GATEHEAD_FIGURES_FILE, and the view renders it."""
    from gatehead.evals.agreement import Agreement
    from gatehead.evals.stability import Diff, StabilityResult

    out = tmp_path / "figures.json"
    monkeypatch.setenv("GATEHEAD_FIGURES_FILE", str(out))
    stable = StabilityResult(Diff(64, 0, (), 0.0), Diff(64, 0, (), 0.0))
    broken = StabilityResult(Diff(64, 0, (), 0.0), Diff(64, 3, (5, 9, 1), 0.25))
    record_figure("tiny/stability", "answer stability", stable)
    record_figure("tiny/perturbed", "negative control", broken)
    agree = Agreement(256, 1, 0.0125, 0.004, {"answer": 200, "search": 56}, {"answer": 201, "search": 55})
    record_figure("tiny/agreement", "shared vs dedicated", agree)
    record_figure("tiny/bounds", "bounds", {"shared vs dedicated, max |dp|": (0.0125, 0.02), "mean": (0.5, 0.1)})
    record_figure("demo/other", "not in the tiny table", 1.0)
    data = json.loads(out.read_text())
    assert data["figures"]["tiny/perturbed"]["value"]["passed"] is False
    assert data["figures"]["tiny/stability"]["value"]["shared_vs_stock"]["requests"] == 64
    envelope = {"item": "fidelity", "command": "pytest ...", "date": "2026-12-03T10:00:00Z", "results": data,
                "machine": {"cpus": 2, "bf16": "AVX-512 BF16"}}
    envelope["results"]["tests"] = {"tests/a.py::one": "passed", "tests/a.py::two": "failed"}
    envelope["results"].update(cpu_isa="native", dtype="bfloat16")  # as measured on the host, whatever this one is
    emulated = json.loads(json.dumps(envelope))
    emulated["results"].update(cpu_isa="avx512", dtype=None)  # emulated bf16: before dtype auto, no dtype recorded
    del emulated["results"]["figures"]["tiny/bounds"]
    as_avx2 = json.loads(json.dumps(emulated))
    as_avx2["results"].update(cpu_isa="avx2", dtype="float32")  # dtype auto as an AVX2 CPU
    table = figures.VIEWS["tests-tiny"]([envelope, emulated, as_avx2])
    assert "tests 1 failed, 1 passed" in table and "emulated bf16 (on a host with bf16 by AVX-512 BF16)" in table
    assert "bf16 by AVX-512 BF16" in table and "fp32 as an AVX2 CPU (on a host with bf16 by AVX-512 BF16)" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ")}
    assert "0 of 64 requests differ" in rows["answer stability"]
    assert "3 of 64 requests differ" in rows["negative control"] and "**fails**" in rows["negative control"]
    assert "1 flip of 256, max / mean \\|dp\\| 0.0125 / 0.00400 (answer 200, search 56)" in rows["shared vs dedicated"]
    assert "0.0125 <= 0.0200" in rows["bounds"] and "0.5000 **>** 0.1000" in rows["bounds"]
    assert rows["bounds"].rstrip(" |").endswith("-")  # not measured in the second envelope
    assert "not in the tiny table" not in table


def test_sigterm_ends_the_runner_as_an_interrupt_does() -> None:
    """So that an item's process group, in a session of its own, is stopped with the runner."""
    code = ("import os, signal; from gatehead.figures.runner import stop_on_signals; stop_on_signals()\n"
            "try:\n    os.kill(os.getpid(), signal.SIGTERM)\nexcept SystemExit as stop:\n    print('exit', stop.code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["exit", str(128 + 15)]


@pytest.mark.parametrize("native", [True, False])
def test_an_item_of_one_cpu_kind_runs_on_that_kind_only(root: Path, tmp_path: Path, monkeypatch, capsys,
                                                        native: bool) -> None:
    """The demo's turn timings have a target per kind (bf16 native or not): each item measures its own kind,
    refuses the other by name, and a run of every item leaves it out there."""
    from gatehead.runtime import dtype

    monkeypatch.setattr(dtype, "cpu_kind", lambda: "avx512_bf16" if native else "avx2")
    mine, other = item(bf16=native), item(name="toy-other", bf16=not native)
    assert figures.wrong_host(mine) is None and figures.wrong_host(item()) is None
    assert run_item(mine, tmp_path / "figs", root)["results"]["accuracy"] == 0.5
    with pytest.raises(RuntimeError, match=f"{'without' if native else 'with'} native bf16, and this one's bf16 path "
                                           f"is {'AVX-512 BF16' if native else 'emulated'}"):
        run_item(other, tmp_path / "figs", root)
    assert not (tmp_path / "figs" / "toy-other.json").exists()
    turns = {i.bf16: i for i in figures.ITEMS if i.name.startswith("demo-turns")}
    assert turns[True].argv == turns[False].argv
    assert f"({turns[native].name} measures this kind)" in figures.wrong_host(turns[not native])
    monkeypatch.setattr(figures, "ITEMS", (mine, other))
    ran: list[str] = []
    monkeypatch.setattr(figures, "run_item", lambda i, *a, **k: ran.append(i.name) or {"seconds": 0.0})
    assert figures.main(figures.FiguresConfig(dir=tmp_path / "figs")) == 0
    assert ran == ["toy"] and "toy-other: left out: toy-other is measured on a CPU" in capsys.readouterr().err


def test_an_item_runs_with_bytecode_and_vllms_layout_unless_it_asks(monkeypatch, tmp_path: Path) -> None:
    """Items measure as an installed package runs: bytecode kept (PYTHONDONTWRITEBYTECODE dropped), vLLM's
    default process layout; an item that names a variable keeps it."""
    from gatehead.figures.runner import environment

    for name in ("PYTHONDONTWRITEBYTECODE", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(name, "1")
    plain = Item("x", "x", 1, ("true",), "file", ())
    env = environment(plain, tmp_path / "out.json", tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    asking = Item("y", "y", 1, ("true",), "file", (), env={"PYTHONDONTWRITEBYTECODE": "1"})
    assert environment(asking, tmp_path / "out.json", tmp_path)["PYTHONDONTWRITEBYTECODE"] == "1"
