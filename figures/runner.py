"""Running an item: its command as a subprocess with a time limit, and the envelope it writes
(`docs/figures/<item>.json`: command, commit and dirty flag, date, seconds, machine, fingerprints, results).
Sealed data: an item that reads the demo's test split refuses a second reading of the same weights unless
asked (`reread`), and a dirty tree is measured only when asked (`allow_dirty`)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from gatehead import provenance
from gatehead.digest import fingerprint
from gatehead.figures.items import FIGURES_DIR, FIGURES_ENV, LEDGER, ROOT, SUITE_LAYOUT, Item, wrong_host


def fingerprints(item: Item, root: Path = ROOT) -> dict[str, str]:
    return {role: fingerprint(root / rel) for role, rel in item.fingerprints}


# ----- running -------------------------------------------------------------------------------------


def _fill(out: Path, folder: Path) -> dict[str, str]:
    return {"{python}": sys.executable, "{gatehead}": str(Path(sys.executable).with_name("gatehead")),
            "{out}": str(out), "{dir}": str(folder)}


def _filled(text: str, fill: Mapping[str, str]) -> str:
    for placeholder, value in fill.items():
        text = text.replace(placeholder, value)
    return text


def command_line(item: Item, out: Path, folder: Path) -> list[str]:
    fill = _fill(out, folder)
    return [_filled(arg, fill) for arg in item.argv]


def environment(item: Item, out: Path, folder: Path) -> dict[str, str]:
    """The item's process environment: this one's, the item's own settings (placeholders filled in), and
    vLLM's default process layout unless the item asks for the suite's. Python keeps gatehead's bytecode, as
    an installed package has it: compiled from source in every engine process instead, its modules leave the
    compiler's freed memory resident (1.4 MB in the worker, measured), which vLLM sizes its KV pool after."""
    fill = _fill(out, folder)
    env = {**os.environ, **{k: _filled(v, fill) for k, v in item.env.items()}}
    for name in (*SUITE_LAYOUT, *FIGURES_ENV, "PYTHONDONTWRITEBYTECODE"):
        if name not in item.env:
            env.pop(name, None)
    return env


def shown(item: Item) -> str:
    """The command as a person would type it from the repository root."""
    fill = {"{python}": "python", "{gatehead}": "gatehead", "{out}": "OUT.json", "{dir}": "OUT"}
    env = " ".join(f"{k}={_filled(v, fill)}" for k, v in item.env.items())
    return " ".join(filter(None, [env, shlex.join(_filled(a, fill) for a in item.argv)]))


def _progress(label: str, expected_s: float, done: threading.Event) -> None:
    from tqdm import tqdm

    with tqdm(total=round(expected_s), desc=label, unit="s", leave=True, file=sys.stderr,
              bar_format="{desc}: {bar} {n_fmt}/{total_fmt} s expected") as bar:
        started = time.monotonic()
        while not done.wait(1.0):
            elapsed = round(time.monotonic() - started)
            bar.total = max(bar.total, elapsed)
            bar.update(elapsed - bar.n)


def _results(item: Item, out: Path, folder: Path, stdout: str) -> dict:
    if item.results == "file":
        return json.loads(out.read_text())
    if item.results == "dir":
        return json.loads((folder / "result.json").read_text())
    return json.loads(stdout)


def sealed_read(item: Item, figures_dir: Path, root: Path = ROOT, build: bool = False) -> bool:
    """Whether the model and adapter committed now were already measured on a sealed item's test split:
    its file holds such a reading, or the ledger records one (`demo.sealed`, any command that read it) of the
    weights the item measures (`Item.measured_model`; `build`: the model may be built to fingerprint it)."""
    from gatehead.demo.sealed import readings

    if not item.sealed:
        return False
    now = fingerprints(item, root)
    path = figures_dir / f"{item.name}.json"
    if path.exists() and json.loads(path.read_text()).get("fingerprints") == now:
        return True
    recorded = {k: v for k, v in now.items() if k in ("model", "adapter")}
    if item.measured_model is not None:
        model = item.measured_model(build)
        if model is None:  # not built here: no reading of it can be matched (run_item builds it first)
            return False
        recorded["model"] = fingerprint(model)
    return bool(readings(recorded, root / LEDGER))


def _inside(path: Path | None, root: Path) -> tuple[str, ...]:
    """`path` relative to `root` where it lies inside it (what a run writes there is not a change measured)."""
    if path is None:
        return ()
    try:
        return (str(Path(path).resolve().relative_to(root.resolve())),)
    except ValueError:
        return ()


def _run_whole(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run` in a process group of its own, stopped whole when it ends, runs past `timeout`, or this
    process stops waiting (an interrupt, or SIGTERM/SIGHUP: `stop_on_signals`): an item's engine processes
    must not outlive it, holding cores that the next item measures on."""
    with subprocess.Popen(argv, start_new_session=True, **kwargs) as proc:
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        finally:
            _stop_group(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout)


def _stop_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to `proc`'s process group (vLLM's engines clean up their shared memory and temporary exports),
    SIGKILL to what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # nothing of the group is left
        deadline = time.monotonic() + grace_s
        while sig == signal.SIGTERM and time.monotonic() < deadline and (proc.poll() is None or
                                                                          _group_alive(proc.pid)):
            time.sleep(0.1)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP end this process as an interrupt does, so a running item's group is stopped with it
    (the item is in a session of its own: a closed terminal or a harness's SIGTERM would not reach it)."""
    def leave(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, leave)


def run_item(item: Item, figures_dir: Path = FIGURES_DIR, root: Path = ROOT, reread: bool = False,
             log_dir: Path | None = None, allow_dirty: bool = False) -> dict:
    """Run one item; on success write and return its envelope. Raises RuntimeError on failure, and before
    running on a tree with uncommitted changes unless `allow_dirty` (the envelope then records `dirty`), and on a
    host of another CPU kind than the item's (`Item.bf16`)."""
    if (why := wrong_host(item)) is not None:
        raise RuntimeError(why)
    # What `gatehead figures` itself writes (the envelopes, the ledger, its logs) is not a change to the code.
    commit, dirty = provenance.commit(root, exclude=_inside(figures_dir, root) + _inside(log_dir, root))
    if commit is None:
        raise RuntimeError(f"gatehead figures measures a git checkout's commit, and {root} is none")
    if dirty and (item.sealed or not allow_dirty):
        raise RuntimeError(f"{root} has uncommitted changes: a figure measures a commit (commit first" + (
            "; an item that reads sealed test data is read once, on committed code only)" if item.sealed else
            ", or --dirty to measure anyway: the envelope and every block that renders it say so)"))
    earlier = sealed_read(item, figures_dir, root, build=True)
    if earlier and not reread:
        raise RuntimeError(f"{item.name} reads sealed held-out data and was read on this model and adapter "
                           f"({figures_dir / (item.name + '.json')}); --reread reads it again, as a development figure")
    work = Path(tempfile.mkdtemp(prefix=f"figures-{item.name}-"))
    out, folder = work / "result.json", work / "out"
    log = (log_dir or work) / f"{item.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = environment(item, out, folder)
    done, started = threading.Event(), time.monotonic()
    bar = threading.Thread(target=_progress, args=(item.name, 60 * item.minutes, done), daemon=True)
    bar.start()
    try:
        with log.open("w") as stderr:  # a command whose results are not its stdout logs its stdout too
            stdout = subprocess.PIPE if item.results == "stdout" else stderr
            proc = _run_whole(command_line(item, out, folder), item.limit_s, cwd=root, env=env, stdout=stdout,
                              stderr=stderr, text=True)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{item.name} ran past its limit of {item.limit_s / 60:.0f} min (log: {log})") from exc
    finally:
        done.set()
        bar.join()
    seconds = time.monotonic() - started
    if proc.returncode not in item.ok_codes:
        raise RuntimeError(f"{item.name} exited {proc.returncode} (log: {log})")
    try:
        results = _results(item, out, folder, proc.stdout)
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{item.name} wrote no readable results: {exc} (log: {log})") from exc
    envelope = {
        "item": item.name, "about": item.about, "command": shown(item), "exit_code": proc.returncode,
        "commit": commit, "dirty": dirty,  # as the item started
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "seconds": round(seconds, 1),
        "machine": provenance.machine(), "fingerprints": fingerprints(item, root),
        "reread": earlier,  # a development figure: these weights were measured on this test split before
        "results": results,
    }
    figures_dir.mkdir(parents=True, exist_ok=True)
    target = figures_dir / f"{item.name}.json"
    partial = target.with_suffix(".json.tmp")
    partial.write_text(json.dumps(envelope, indent=1) + "\n")
    partial.replace(target)
    return envelope


