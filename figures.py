"""`gatehead figures`: re-measure the figures the README reports, each into a results file of its own.

Every item is one command of this repository (an eval, a benchmark, the demo kit's evaluation) run
as a subprocess with a time limit. A finished item writes `docs/figures/<item>.json`: the command, the
commit (and whether the tree had uncommitted changes), the date, how long it took, the machine, the
fingerprints of the model and adapter it measured, and the command's own results. A failed or timed-out
item leaves its previous file alone and makes the run exit 1. The evals append their verdicts to
the demo's append-only ledger, `evals/demo-ledger.jsonl`.

Sealed data: the demo's test split (with its hand-written questions) is read once per committed model
(`demo-test`, `eval-dataset-test`): an item of that kind refuses to run again while its file holds the
fingerprints of the model and adapter committed now, unless `--reread` says the reading is deliberate
(the file then records `reread: true`, and the README calls its figures development figures).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gatehead import provenance
from gatehead.provenance import RUN_OUTPUTS, fingerprint

ROOT = Path(__file__).resolve().parent
FIGURES_DIR = ROOT / "docs" / "figures"
LEDGER = "evals/demo-ledger.jsonl"  # append-only: every verdict on the demo model, failures included
assert LEDGER in RUN_OUTPUTS  # what the items write is not a change to the code measured
# The demo model is built at setup from the pinned registry base and the committed generator LoRA (checked
# against `demo.finetune.MERGED_SHA256`): the generator's folder is what identifies it in the repository.
DEMO_MODEL, DEMO_ADAPTER, DEMO_SUFFIX_ADAPTER = "demo/generator", "demo/adapter", "demo/adapter-suffix"
RANDOM_DIR = ".cache/bench-random"
EVAL_SIZES = ("--max-model-len", "2048", "--block-size", "32")
SUITE_LAYOUT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}  # as tests/conftest.py runs engines


@dataclass(frozen=True)
class Item:
    """One measurement: a command and where its results land."""

    name: str
    about: str
    minutes: float  # expected on a 2-core CPU
    argv: tuple[str, ...]  # {python}, {gatehead}, {out} (a JSON file) and {dir} (a folder) are filled in
    results: str  # "file": {out}; "dir": {dir}/result.json; "stdout": the command's stdout is JSON
    fingerprints: tuple[tuple[str, str], ...]  # (role, path relative to the repository root), hashed after the run
    env: Mapping[str, str] = field(default_factory=dict)
    ok_codes: tuple[int, ...] = (0,)  # the evals exit 1 when their rule fails: a verdict, still a figure
    sealed: bool = False  # reads held-out data that is read once per committed model
    limit_minutes: float = 0.0  # 0: three times the expected minutes
    cuda: bool = False  # runs on a CUDA GPU only: left out of a run of every item on a machine without one

    @property
    def limit_s(self) -> float:
        return 60 * (self.limit_minutes or 3 * self.minutes)


DEMO = (("model", DEMO_MODEL), ("adapter", DEMO_ADAPTER))  # the prompt-mode gate
DEMO_DEFAULT = (("model", DEMO_MODEL), ("adapter", DEMO_SUFFIX_ADAPTER))  # the demo's default gate (suffix mode)
DEMO_BOTH = DEMO + (("suffix_adapter", DEMO_SUFFIX_ADAPTER),)
PROMPT_GATE = ("--adapter", DEMO_ADAPTER)  # the evals that judge the prompt-mode gate name it
RANDOM = (("model", f"{RANDOM_DIR}/model"), ("adapter", f"{RANDOM_DIR}/adapter"),
          ("suffix_adapter", f"{RANDOM_DIR}/suffix/adapter"))


# The fidelity figures are measured by the tests that judge them: with GATEHEAD_FIGURES_FILE set, their
# `record_figure` fixture (tests/conftest.py) writes each figure and each test's outcome there.
FIGURES_ENV = {"GATEHEAD_FIGURES_FILE": "{out}"}
FIDELITY_TESTS = ("tests/integration/runtime/test_fidelity.py", "tests/integration/runtime/test_fidelity_compile.py",
                  "tests/integration/runtime/test_chunking.py", "tests/integration/runtime/test_demo_fidelity.py",
                  "tests/integration/runtime/test_tensor_parallel.py")


def _pytest(*paths: str) -> tuple[str, ...]:
    return ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths)


def _eval(name: str, *args: str) -> tuple[str, ...]:
    return ("{gatehead}", "eval", name, *args, *EVAL_SIZES, "--ledger", LEDGER, "--out", "{dir}")


def _evaluate(split: str, *args: str) -> tuple[str, ...]:
    return ("{python}", "-m", "gatehead.demo.build", "evaluate", "--split", split, *args, "--device", "cpu",
            "--out", "{out}")


ITEMS: tuple[Item, ...] = (
    Item("eval-stability", "stability eval, demo model, vLLM's default process layout", 3,
         _eval("stability", "--variants", "plain,mixed", *PROMPT_GATE), "dir", DEMO, ok_codes=(0, 1)),
    Item("eval-stability-suite-layout", "stability eval as the test suite runs engines (in-process, 1 thread)", 3,
         _eval("stability", "--variants", "plain,mixed", *PROMPT_GATE), "dir", DEMO, env=SUITE_LAYOUT,
         ok_codes=(0, 1)),
    Item("eval-agreement", "agreement eval (shared vs dedicated vs HF), demo model, default layout", 3,
         _eval("agreement", *PROMPT_GATE), "dir", DEMO, ok_codes=(0, 1)),
    Item("eval-agreement-suite-layout", "agreement eval as the test suite runs engines", 3,
         _eval("agreement", *PROMPT_GATE), "dir", DEMO, env=SUITE_LAYOUT, ok_codes=(0, 1)),
    Item("eval-kv", "KV capacity, stock vs shared, and the plugin's memory", 2, _eval("kv", *PROMPT_GATE), "dir", DEMO,
         ok_codes=(0, 1)),
    Item("eval-dataset-val", "the agent over the demo's validation split", 20,
         _eval("dataset", "--demo", "val"), "dir", DEMO_DEFAULT,
         ok_codes=(0, 1)),
    Item("eval-dataset-test", "the agent over the demo's held-out test split: read once per committed model", 20,
         _eval("dataset", "--demo", "test"), "dir", DEMO_DEFAULT, ok_codes=(0, 1), sealed=True),
    Item("eval-threads-test", "the agent over the hand-written threads (test products): read once per committed model",
         8, _eval("threads"), "dir", DEMO_DEFAULT, ok_codes=(0, 1), sealed=True),
    Item("demo-val", "the demo kit's figures on its validation split (model and calibration chosen on it), default "
         "gate", 40, _evaluate("val", "--adapter", "adapter-suffix"), "file", DEMO_DEFAULT),
    Item("demo-test", "the demo kit's held-out test figures, default gate: read once per committed model", 45,
         _evaluate("test", "--adapter", "adapter-suffix"), "file", DEMO_DEFAULT, sealed=True),
    Item("demo-test-prompt", "the prompt-mode gate alone on the held-out test sets: read once per committed gate", 20,
         _evaluate("test", "--adapter", "adapter", "--gate-only"), "file", DEMO, sealed=True),
    Item("agent-ttft", "answer time to first token after the gate vs cold, demo model", 2,
         ("{python}", "-m", "gatehead.benchmarks.agent_ttft", "--block-size", "32"), "stdout", DEMO),
    Item("guard-rates", "the degenerate-output guard's rates and engine-fault drill, demo model", 20,
         ("{python}", "-m", "gatehead.benchmarks.guard_rates", "--out", "{out}"), "file", DEMO),
    Item("suffix-latency", "prompt-mode vs suffix-mode gate latency at ~1,900 tokens, demo model", 2,
         ("{python}", "-m", "gatehead.benchmarks.suffix_latency", "--out", "{out}"), "file", DEMO_BOTH),
    Item("fidelity", "fidelity and tensor-parallel tests with their figures (tiny and demo models), as the suite "
         "runs engines", 35, _pytest(*FIDELITY_TESTS), "file", DEMO, env={**SUITE_LAYOUT, **FIGURES_ENV},
         ok_codes=(0, 1)),
    Item("fidelity-emulated", "the same as a CPU with AVX-512F and no bf16 computes (GATEHEAD_TEST_CPU_ISA=avx512): "
         "dtype auto runs fp32 there", 35, _pytest(*FIDELITY_TESTS), "file", DEMO,
         env={**SUITE_LAYOUT, **FIGURES_ENV, "GATEHEAD_TEST_CPU_ISA": "avx512"}, ok_codes=(0, 1)),
    Item("fidelity-avx2", "the same as an AVX2 CPU without AVX-512 computes (GATEHEAD_TEST_CPU_ISA=avx2): "
         "dtype auto runs fp32 there, and the fp32 rules are judged", 25, _pytest(*FIDELITY_TESTS), "file", DEMO,
         env={**SUITE_LAYOUT, **FIGURES_ENV, "GATEHEAD_TEST_CPU_ISA": "avx2"}, ok_codes=(0, 1)),
    Item("soak", "the comparing soak: a real server under mixed load and faults for 600 s, then each request alone",
         13, _pytest("tests/integration/server/test_soak.py"), "file", DEMO,
         env={**SUITE_LAYOUT, **FIGURES_ENV, "GATEHEAD_SOAK_SECONDS": "600"}, ok_codes=(0, 1)),
    Item("gpu-branch", "the branch against a dedicated gate at a 27B-like shape, PyTorch alone: needs a CUDA GPU",
         5, ("bash", "-c", "set -e; mkdir -p {dir}; for i in 1 2 3; do {python} -m gatehead.benchmarks.gpu_branch "
             "> {dir}/run$i.json; done; {python} -m gatehead.benchmarks.gpu_branch --combine {dir}/run1.json "
             "{dir}/run2.json {dir}/run3.json > {out}"), "file", (), cuda=True),
    Item("bench-demo", "gatehead bench, every setup and workload, demo model", 35,
         ("{gatehead}", "bench", "--model", "demo", "--block-size", "32", "--out", "{out}"), "file", DEMO_BOTH),
    Item("bench-demo-priority", "the answer after or beside the gate, first come or by priority, demo model", 10,
         ("{gatehead}", "bench", "--model", "demo", "--block-size", "32", "--setups", "a_suffix", "a_overlap",
          "a_suffix_prio", "a_overlap_prio", "c0_stock", "--workloads", "single", "multi", "refuse", "--out", "{out}"),
         "file", DEMO_BOTH),
    Item("bench-random", "gatehead bench on the 0.36 B random model (where the targets are set)", 360,
         ("{gatehead}", "bench", "--model", "random", "--block-size", "32", "--memory-fraction", "0.2",
          "--out", "{out}"), "file", RANDOM, limit_minutes=600),
)


def by_name(names: Sequence[str]) -> list[Item]:
    known = {item.name: item for item in ITEMS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown figures item(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]


# ----- provenance ----------------------------------------------------------------------------------


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
    vLLM's default process layout unless the item asks for the suite's."""
    fill = _fill(out, folder)
    env = {**os.environ, **{k: _filled(v, fill) for k, v in item.env.items()}}
    for name in (*SUITE_LAYOUT, *FIGURES_ENV):
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


def sealed_read(item: Item, figures_dir: Path, root: Path = ROOT) -> bool:
    """Whether the model and adapter committed now were already measured on a sealed item's test split:
    its file holds such a reading, or the ledger records one (`demo.sealed`, any command that read it)."""
    from gatehead.demo.sealed import readings

    if not item.sealed:
        return False
    now = fingerprints(item, root)
    path = figures_dir / f"{item.name}.json"
    if path.exists() and json.loads(path.read_text()).get("fingerprints") == now:
        return True
    return bool(readings({k: v for k, v in now.items() if k in ("model", "adapter")}, root / LEDGER))


def run_item(item: Item, figures_dir: Path = FIGURES_DIR, root: Path = ROOT, reread: bool = False,
             log_dir: Path | None = None) -> dict:
    """Run one item; on success write and return its envelope. Raises RuntimeError on failure."""
    earlier = sealed_read(item, figures_dir, root)
    if earlier and not reread:
        raise RuntimeError(f"{item.name} reads sealed held-out data and was read on this model and adapter "
                           f"({figures_dir / (item.name + '.json')}); --reread reads it again, as a development figure")
    work = Path(tempfile.mkdtemp(prefix=f"figures-{item.name}-"))
    out, folder = work / "result.json", work / "out"
    log = (log_dir or work) / f"{item.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = environment(item, out, folder)
    # What `gatehead figures` itself writes (the envelopes, the ledger) does not make the measured code dirty.
    commit, dirty = provenance.commit(root)
    if commit is None:
        raise RuntimeError(f"gatehead figures measures a git checkout's commit, and {root} is none")
    done, started = threading.Event(), time.monotonic()
    bar = threading.Thread(target=_progress, args=(item.name, 60 * item.minutes, done), daemon=True)
    bar.start()
    try:
        with log.open("w") as stderr:  # a command whose results are not its stdout logs its stdout too
            stdout = subprocess.PIPE if item.results == "stdout" else stderr
            proc = subprocess.run(command_line(item, out, folder), cwd=root, env=env, stdout=stdout,
                                  stderr=stderr, text=True, timeout=item.limit_s)
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


# ----- README blocks --------------------------------------------------------------------------------
#
# A figure table in the README sits between `<!-- figures SOURCE VIEW -->` and `<!-- /figures -->`:
# SOURCE is a results file (a `docs/figures/` envelope, or a benchmark's own results file), VIEW names
# the renderer. `gatehead figures --readme` rewrites every block from its file; the test suite renders
# them again and fails on any difference, and on an envelope whose fingerprints are not the committed
# model's.

PAGES = ("README.md", "docs/figures.md", "docs/demo-model.md")  # the pages whose figure blocks are rendered
BLOCK = re.compile(r"<!-- figures (?P<source>\S+) (?P<view>\S+) -->\n(?P<body>.*?)<!-- /figures -->", re.S)


def _bench_view(results: dict) -> str:
    from gatehead.benchmarks.bench_report import readme_tables

    return readme_tables(results)


def _threads_view(results: dict) -> str:
    from gatehead.benchmarks.bench_report import threads_table

    return f"`{results['command']}`, {results['date'][:10]}:\n\n" + threads_table(results)


def _eval_figures(r: dict) -> str:
    """One eval's result.json in a line: the figures its rule judges."""
    if r["eval"] == "stability":
        return "; ".join(f"{name}: {v['shared_vs_stock']['differing']} of {v['shared_vs_stock']['requests']} requests "
                         f"differ, max abs dlogprob {v['shared_vs_stock']['max_abs_dlogprob']:.3g} (stock repeats "
                         f"{v['stock_vs_stock']['differing']})" for name, v in r["variants"].items() if v.get("judged"))
    if r["eval"] == "agreement":
        return "; ".join(f"{name}: {p['flips']} flip{'' if p['flips'] == 1 else 's'}, max abs dp {p['max_dp']:.4f}"
                         for name, p in r["pairs"].items())
    if r["eval"] == "kv":
        c, w, mib = r["capacity"], r["weights_bytes"], 1 << 20
        return (f"stock {c['stock']['tokens']:,} tokens, shared {c['shared']['tokens']:,} ({r['kv_ratio']:.4f}); "
                f"weights {w['one_engine'] / mib:.1f} MiB in one engine, {w['two_engines'] / mib:.1f} MiB in two")
    if r["eval"] == "dataset":
        recall = ", ".join(f"{k} {v:.3f}" for k, v in r["classes"]["recall"].items())
        answers = r.get("answers") or {}
        em = f"; answer EM {answers['exact_match']:.3f} over {answers['scored']}" if answers.get("scored") else ""
        return (f"{r['questions']} questions: accuracy {r['accuracy']:.3f}, recall {recall}, ECE {r['ece']:.3f}, "
                f"AURC {r['aurc']:.3f}, planted-instruction flips {r['injection_flip_rate']:.3f}{em}")
    if r["eval"] == "threads":
        f = r["figures"]
        return (f"{f['threads']} threads, {f['turns']} turns: right value {_rate(f['right_value_on_answerable'])} of "
                f"answerable turns, rewrites adding a name {f['rewrites_adding_a_name']['used']} used "
                f"({f['rewrites_adding_a_name']['model']} written)")
    raise ValueError(f"no README line for eval {r['eval']!r}")


def _rate(x: dict) -> str:
    return f"{x['rate']:.1%} ({x['right']} of {x['turns']})" if x["turns"] else "- (0 turns)"


def _threads_eval_view(envelopes: list[dict]) -> str:
    """`gatehead eval threads`: the hand-written threads through the whole agent, a row per figure."""
    from gatehead.evals.run import table

    [e] = envelopes
    f = e["results"]["figures"]
    rows = [["right value, answerable turns", _rate(f["right_value_on_answerable"])],
            ["right value, answerable follow-ups", _rate(f["follow_ups_on_answerable"])],
            ["refused where expected", _rate(f["refused_where_expected"])],
            ["asked back where expected (nothing to refer to)", _rate(f["asked_back_where_expected"])],
            *[[f"case: {case}", _rate(x)] for case, x in f["by_case"].items()],
            ["rewrites adding a name: written by the model / used", f"{f['rewrites_adding_a_name']['model']} / "
             f"{f['rewrites_adding_a_name']['used']}"],
            ["answers flagged `grounded: false`", f["answers_flagged_ungrounded"]],
            ["turns that failed", f["errors"]]]
    return (_measured(e) + f"; {f['threads']} threads, {f['turns']} turns.\n\n" + table(["figure", "value"], rows))


def _evals_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    rows = [[e["item"], e["results"]["verdict"], _eval_figures(e["results"]), e["date"][:10],
             f"{e['machine']['cpus']} cores, bf16 by {e['machine']['bf16']}"] for e in envelopes]
    return table(["item", "verdict", "figures", "measured", "machine"], rows)


def _measured(e: dict) -> str:
    """An envelope's command, date and machine, as a table's first line begins."""
    return f"`{e['command']}`: {e['date'][:10]}, {e['machine']['cpus']} cores (bf16 by {e['machine']['bf16']})"


def _ttft_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    rows = [[name.replace("_", " "), w["requests"], f"{w['prompt_tokens_mean']:.0f}", f"{w['cached_tokens_mean']:.0f}",
             f"{w['cold_ttft_ms_median']:.1f}", f"{w['after_gate_ttft_ms_median']:.1f}", f"{w['ratio_of_medians']:.2f}"]
            for name, w in r.items() if isinstance(w, dict) and "ratio_of_medians" in w]
    return (_measured(e) + ", "
            f"{r.get('mode', '')}, {r.get('block_size')}-token blocks.\n\n" + table(
                ["workload", "requests", "prompt tokens", "read from the gate's prefill", "TTFT cold ms",
                 "TTFT after the gate ms", "ratio"], rows))


def _suffix_latency_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    rows = [[f"{name} mode", g["prompt_tokens"], g["cached_tokens"][0], f"{g['median_s']:.3f}", f"{g['spread_s']:.3f}"]
            for name, g in r["gates"].items()]
    return (_measured(e) + "; "
            f"prompt mode / suffix mode {r['median_ratio_prompt_over_suffix']:.1f}x.\n\n" + table(
                ["gate", "prompt tokens", "read from the cache", "median s", "spread s"], rows))


def _guard_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    r = e["results"]
    rows = [[name.replace("_", " "), x["outputs"], x["tripped"], "-"] for name, x in r.items()
            if name.startswith("clean_")]
    rows += [[name.removeprefix("fault_").replace("_", " ") + " (injected)", x["outputs"], x["detected"],
              f"{x['detected'] / x['outputs']:.1%}" if x["outputs"] else "-"] for name, x in r.items()
             if name.startswith("fault_")]
    rows += [[name.removeprefix("engine_kv_") + " KV blocks (engine fault)", x["outputs"],
              f"{x['detected']} of {x['changed']} changed answers",
              f"{x['detected'] / x['changed']:.1%}" if x["changed"] else "-"] for name, x in r.items()
             if name.startswith("engine_kv_")]
    took = f"{e['seconds'] / 60:.0f} min"
    return (_measured(e) + ", "
            f"{took}; improbable run: {r['guard']['improbable_run']} tokens below logprob "
            f"{r['guard']['improbable_logprob']}.\n\n"
            + table(["outputs", "n", "guard tripped / detected", "detection rate"], rows))


SET_NAMES = {"template": "template", "phrased": "phrased, unseen families", "out_of_scope": "out of scope (refused)",
             "handwritten": "typed by hand"}


def _demo_sets_view(results: dict) -> str:
    """`python -m gatehead.demo.build evaluate`'s figures, a row per evaluation set."""
    from gatehead.evals.run import table

    rows = []
    for name, v in results["sets"].items():
        gate, recall = v["gate"], v["gate"]["recall"]
        answered = f"{v['answer_exact_match']:.1%} ({v['answerable']})" if v["answerable"] else ""
        recalls = (" / ".join(f"{100 * recall[c]:.1f}" for c in ("answer", "refuse", "search")) + "%"
                   if v["answerable"] else "")
        rows.append([f"{results['split']}: {SET_NAMES.get(name, name)}", v["questions"], f"{gate['accuracy']:.1%}",
                     answered, recalls])
    return (f"`{results['command']}` ({results['device']}):\n\n"
            + table(["set", "questions", "gate accuracy", "answer exact match", "recall answer / refuse / search"],
                    rows))


def _small(x: float, fmt: str) -> str:
    """`x` in `fmt`, or in two significant digits where `fmt` would show a nonzero value as zero."""
    return f"{x:.1e}" if 0 < abs(x) < 1e-4 else f"{x:{fmt}}"


def _figure_cell(value) -> str:
    """One recorded test figure (tests/conftest.py `record_figure`) in a table cell, by its shape."""
    if isinstance(value, dict) and "shared_vs_stock" in value:  # a StabilityResult
        a, b = value["shared_vs_stock"], value["stock_vs_stock"]
        return (f"{a['differing']} of {a['requests']} requests differ, max |dlogprob| {a['max_abs_dlogprob']:.3g} "
                f"(stock vs stock: {b['differing']} differ)" + ("" if value["passed"] else "; **fails**"))
    if isinstance(value, dict) and "mix_a" in value:  # an Agreement
        mix = ", ".join(f"{k} {n}" for k, n in sorted(value["mix_a"].items()))
        return (f"{value['flips']} flip{'' if value['flips'] == 1 else 's'} of {value['n']}, max / mean |dp| "
                f"{_small(value['max_dp'], '.4f')} / {_small(value['mean_dp'], '.5f')} ({mix})")
    if isinstance(value, dict) and value and all(isinstance(v, list) and len(v) == 2 for v in value.values()):
        return "; ".join(f"{name}: {fig:.4f}{' <=' if fig <= bound else ' **>**'} "
                         f"{bound:.4f}" for name, (fig, bound) in value.items())  # (figure, bound) pairs
    if isinstance(value, dict) and "within_noise" in value:
        return (f"{value['flips']} flips of {value['gates']}; {value['within_noise']} gates lie within bf16's noise "
                f"({value['noise']:.4f}) of a threshold")
    if isinstance(value, dict) and "preemptions" in value and "max_dp" in value:
        return f"max |dp| {value['max_dp']:.2g}, {value['preemptions']} preemptions"
    if isinstance(value, dict):
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in value.items())
    return str(value)


def _bf16_path(e: dict) -> str:
    isa, dtype = e["results"].get("cpu_isa"), e["results"].get("dtype")  # dtype: recorded since dtype auto
    if isa in ("avx512", "avx2") and dtype == "float32":
        kind = {"avx512": "AVX-512F", "avx2": "AVX2"}[isa]
        return f"fp32 as an {kind} CPU (on a {e['machine']['bf16']} host)"
    emulated = isa == "avx512"
    return f"emulated bf16 (on a {e['machine']['bf16']} host)" if emulated else f"bf16 by {e['machine']['bf16']}"


def _outcomes(e: dict) -> str:
    counts: dict[str, int] = {}
    for outcome in e["results"].get("tests", {}).values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no tests recorded"


def _tests_view(envelopes: list[dict], prefix: str) -> str:
    """Figures recorded by tests, keys under `prefix`: a row each, a column per envelope (a kind of bf16)."""
    from gatehead.evals.run import table

    keys: dict[str, str] = {}
    for e in envelopes:
        for key, figure in e["results"]["figures"].items():
            if key.startswith(prefix):
                keys.setdefault(key, figure["label"])
    rows = [[label] + [_figure_cell(e["results"]["figures"][key]["value"]) if key in e["results"]["figures"] else "-"
                       for e in envelopes] for key, label in keys.items()]
    header = "\n".join(f"- {_bf16_path(e)}: " + _measured(e) + f"; tests {_outcomes(e)}" for e in envelopes)
    return header + "\n\n" + table(["check", *(_bf16_path(e) for e in envelopes)], rows)


def _soak_view(envelopes: list[dict]) -> str:
    from gatehead.evals.run import table

    [e] = envelopes
    figures = e["results"]["figures"]
    load, alone = figures["soak/load"]["value"], figures["soak/alone"]["value"]
    rows = [[what, n] for what, n in sorted(load["outcomes"].items())]
    return (_measured(e) + f"; tests {_outcomes(e)}. {load['clients']} clients for {load['soak_seconds']:.0f} s: "
            f"{load['completed']:,} requests completed, {load['preemptions']:,} preemptions, "
            f"{load['pressure_generations']} pressure generations, {load['canary_checks']} canary checks "
            f"({load['canary_failed_checks']} failed). Against the same requests alone ({alone['compared']:,} "
            f"compared): gate max |dp| {alone['gate_max_dp']:.2g}, generations differing "
            f"{alone['generations_differing_otherwise']} "
            f"(at a near tie: {alone['generations_differing_at_a_near_tie']})."
            "\n\n" + table(["requests", "n"], rows))


def _mode(results: dict) -> str:
    return "suffix mode" if "adapter-suffix" in results["command"] else "prompt mode"


def _gate_modes_view(many: list[dict]) -> str:
    """Gate accuracy and refuse recall per evaluation set, a column per `demo.build evaluate` results file."""
    from gatehead.evals.run import table

    sets = [name for name in many[0]["sets"] if all(name in r["sets"] for r in many)]
    rows = [[SET_NAMES.get(name, name), many[0]["sets"][name]["questions"]]
            + [f"{r['sets'][name]['gate']['accuracy']:.1%}, {r['sets'][name]['gate']['recall']['refuse']:.1%}"
               for r in many] for name in sets]
    sources = "; ".join(f"{_mode(r)}: `{r['command']}` ({r['device']})" for r in many)
    return (sources + "\n\n" + table([f"{many[0]['split']} set", "questions",
                                        *(f"{_mode(r)}: accuracy, refuse recall" for r in many)], rows))


def _spread(m: dict, fmt: str) -> str:
    """A median with its (min-max), as `benchmarks/gpu_branch.py --combine` writes them."""
    return f"{m['median']:{fmt}} ({m['min']:{fmt}}-{m['max']:{fmt}})"


def _gpu_branch_view(r: dict) -> str:
    """`benchmarks/gpu_branch.py`'s combined runs: the branch against a dedicated gate at a 27B-like shape."""
    from gatehead.evals.run import table

    prompt = table(["gate prompt", "dedicated full forward ms", "shared engine's branch ms", "ratio"],
                   [[f"{t['prompt_tokens']:,} tokens", _spread(t["dedicated_full_forward"], ".1f"),
                     _spread(t["shared_branch_marginal"], ".2f"), _spread(t["ratio"], ".3f")] for t in r["timings_ms"]])
    suffix = table(["cached prefix", "dedicated, full", "dedicated, prefix cached", "suffix branch, eager", "/ full",
                    "/ prefix cached", "CUDA graph", "/ full"],
                   [[f"{t['cached_prefix_tokens']:,} tokens", _spread(t["dedicated_full_forward"], ".1f"),
                     _spread(t["dedicated_prefix_cached"], ".1f"), _spread(t["suffix_branch"], ".2f"),
                     _spread(t["ratio"], ".4f"), _spread(t["ratio_to_prefix_cached"], ".3f"),
                     _spread(t["suffix_branch_cuda_graph"], ".2f"), _spread(t["ratio_cuda_graph"], ".4f")]
                    for t in r["suffix_mode_ms"]])
    batched = table(["8 gate prompts of", "sequential ms", "batched ms", "ratio",
                     "max \\|logit\\| batched vs sequential"],
                    [[f"{min(b['prompt_tokens']):,}-{max(b['prompt_tokens']):,} tokens",
                      _spread(b["sequential"], ".1f"),
                      _spread(b["batched"], ".1f"), _spread(b["ratio"], ".2f"),
                      f"{b['max_abs_logit_batched_vs_sequential']['max']:.3f}"]
                     for b in r["batched_prompt_mode_ms"].values()])
    shape, w = r["shape"], r["weights_gib"]
    return (f"{r['gpu']}, torch {r['torch']}; {r['parameters_billion']} B parameters ({shape['num_hidden_layers']} "
            f"layers, hidden {shape['hidden_size']}), k={r['k']}, LoRA r={r['lora_rank']}; medians (min-max) over "
            f"{r['runs']} runs, each the median of 5 repeats. Prompt-mode gate (the branch over every tapped row):"
            "\n\n" + prompt + "\nSuffix-mode gate after a cached prefix (ms):\n\n" + suffix
            + "\nBatched prompt-mode branch, one pass against one after another:\n\n" + batched
            + f"\nWeights: one shared engine {w['one_shared_engine']} GiB, generation beside a dedicated gate engine "
            f"{w['two_engines']} GiB.\n")


VIEWS = {"bench": _bench_view, "bench-threads": _threads_view, "demo-sets": _demo_sets_view,
         "gpu-branch": _gpu_branch_view}
MULTI_VIEWS = {"gate-modes": _gate_modes_view}  # of several results files, comma-separated
# Views of `docs/figures/` envelopes (several, comma-separated, for "evals").
ENVELOPE_VIEWS = {"evals": _evals_view, "threads-eval": _threads_eval_view, "agent-ttft": _ttft_view,
                  "suffix-latency": _suffix_latency_view,
                  "guard-rates": _guard_view, "tests-tiny": lambda e: _tests_view(e, "tiny/"),
                  "tests-demo": lambda e: _tests_view(e, "demo/"), "soak": _soak_view}


def load_source(source: str, root: Path = ROOT) -> tuple[dict, dict | None]:
    """(the results, the envelope or None) of a block's source file."""
    data = json.loads((root / source).read_text())
    if "item" in data and "fingerprints" in data and "results" in data:
        return data["results"], data
    return data, None


def render_block(source: str, view: str, root: Path = ROOT) -> str:
    """A block's body: the view of its results, or, where any of them was measured on other weights than
    the committed ones, one line saying so and naming what re-measures it (an old model's table is never shown
    as the committed model's)."""
    if stale := stale_sources(source, root):
        return (f"*Not yet measured on the committed demo model (these figures were measured on an earlier model "
                f"or adapter): {', '.join(stale)}.*\n")
    if view in ENVELOPE_VIEWS:
        envelopes = [load_source(s, root)[1] for s in source.split(",")]
        if any(e is None for e in envelopes):
            raise ValueError(f"view {view!r} renders `gatehead figures` envelopes only: {source}")
        return ENVELOPE_VIEWS[view](envelopes)
    if view in MULTI_VIEWS:
        return MULTI_VIEWS[view]([load_source(s, root)[0] for s in source.split(",")])
    if view not in VIEWS:
        raise ValueError(f"unknown README figures view {view!r}; "
                         f"known: {sorted([*VIEWS, *ENVELOPE_VIEWS, *MULTI_VIEWS])}")
    return VIEWS[view](load_source(source, root)[0])


def stale_sources(source: str, root: Path = ROOT) -> list[str]:
    """What re-measures each of a block's files that was measured on other weights than the committed ones:
    `gatehead figures --only ITEM` for an envelope, the file itself for a `demo.build evaluate` results file."""
    stale = []
    for one in source.split(","):
        results, envelope = load_source(one, root)
        if envelope is not None and envelope["fingerprints"] != fingerprints(by_name([envelope["item"]])[0], root):
            stale.append(f"`gatehead figures --only {envelope['item']}`")
        elif envelope is None and stale_weights(results, root):
            stale.append(f"{one} (of other {', '.join(stale_weights(results, root))})")
    return list(dict.fromkeys(stale))


def stale_weights(results: dict, root: Path = ROOT) -> list[str]:
    """The demo weights a `demo.build evaluate` results file names (`weights_sha256`, 16 hex digits of
    each file's sha256) that are not the committed ones."""
    stale = []
    for rel, digest in results.get("weights_sha256", {}).items():
        path = root / "demo" / rel
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest()[: len(digest)] != digest:
            stale.append(rel)
    return stale


def readme_problems(text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with the README's figure blocks: missing sources, and bodies that are not their sources'
    rendering (an old table, or a table of an earlier model where the rendering says it is not yet measured)."""
    problems = []
    for match in BLOCK.finditer(text):
        source, view = match["source"], match["view"]
        missing = [s for s in source.split(",") if not (root / s).exists()]
        if missing:
            problems.extend(f"{s}: missing" for s in missing)
            continue
        if render_block(source, view, root) != match["body"]:
            problems.append(f"{source} ({view}): the README's table differs from the file's figures")
    return problems


def rewrite_readme(path: Path, root: Path = ROOT, missing: list[str] | None = None) -> int:
    """Re-render every figure block of `path` whose files exist (the others, named in `missing`, stay as
    they are); returns how many blocks changed."""
    text, changed = path.read_text(), 0

    def fill(match: re.Match) -> str:
        nonlocal changed
        absent = [s for s in match["source"].split(",") if not (root / s).exists()]
        if absent:
            if missing is not None:
                missing.extend(absent)
            return match.group(0)
        body = render_block(match["source"], match["view"], root)
        changed += body != match["body"]
        return f"<!-- figures {match['source']} {match['view']} -->\n{body}<!-- /figures -->"

    path.write_text(BLOCK.sub(fill, text))
    return changed


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def main(args: argparse.Namespace) -> int:
    if args.readme:
        missing: list[str] = []
        for page in PAGES:
            changed = rewrite_readme(ROOT / page, missing=missing)
            print(f"{page}: {changed} figure block(s) re-rendered", file=sys.stderr)
        missing = list(dict.fromkeys(missing))
        for source in missing:
            print(f"  not rendered, no results file: {source} (gatehead figures writes it)", file=sys.stderr)
        return 1 if missing else 0
    items = by_name(args.only) if args.only else list(ITEMS)
    if not args.only and not args.list and not _has_cuda():
        for item in [i for i in items if i.cuda]:
            print(f"{item.name}: left out, it needs a CUDA GPU (--only {item.name} on one)", file=sys.stderr)
        items = [i for i in items if not i.cuda]
    if args.list:
        for item in items:
            state = "  [sealed, read on this model]" if item.sealed and sealed_read(item, args.dir) else ""
            print(f"{item.name:28} ~{item.minutes:>4.0f} min  {item.about}{state}")
            print(f"{'':28} {shown(item)}")
        return 0
    total = sum(i.minutes for i in items)
    print(f"{len(items)} item(s), about {total:.0f} min on a 2-core CPU; results in {args.dir}", file=sys.stderr)
    failed = []
    for n, item in enumerate(items, 1):
        print(f"[{n}/{len(items)}] {item.name}: {item.about} (~{item.minutes:.0f} min)", file=sys.stderr)
        try:
            envelope = run_item(item, args.dir, reread=args.reread, log_dir=args.logs)
            print(f"  wrote {args.dir / (item.name + '.json')} in {envelope['seconds'] / 60:.1f} min", file=sys.stderr)
        except RuntimeError as exc:
            failed.append(item.name)
            print(f"  FAILED: {exc}", file=sys.stderr)
    if failed:
        print(f"{len(failed)} of {len(items)} failed, their earlier files kept: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0
