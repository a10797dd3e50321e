"""The figures items: each one command of this repository, what it measures, and the files that identify
what it measured (fingerprints)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gatehead.provenance import RUN_OUTPUTS

ROOT = Path(__file__).resolve().parent.parent  # the repository (the package's root)
FIGURES_DIR = ROOT / "docs" / "figures"
LEDGER = "evals/demo-ledger.jsonl"  # append-only: every verdict on the demo model, failures included
assert LEDGER in RUN_OUTPUTS  # what the items write is not a change to the code measured
# The demo model is built at setup from the pinned registry base and the committed generator LoRA (checked
# against `demo.finetune.MERGED_SHA256`): the generator's folder is what identifies it in the repository.
DEMO_MODEL, DEMO_ADAPTER, DEMO_SUFFIX_ADAPTER = "demo/generator", "demo/adapter", "demo/adapter-suffix"
EVAL_SIZES = ("--max-model-len", "2048", "--block-size", "32")
SUITE_LAYOUT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}  # as tests/conftest.py runs engines


@dataclass(frozen=True)
class Item:
    """One measurement: a command and where its results land."""

    name: str
    about: str
    minutes: float  # expected on a 2-core CPU (the demo items: of the slowest kind, AVX2 only, in fp32)
    argv: tuple[str, ...]  # {python}, {gatehead}, {out} (a JSON file) and {dir} (a folder) are filled in
    results: str  # "file": {out}; "dir": {dir}/result.json; "stdout": the command's stdout is JSON
    fingerprints: tuple[tuple[str, str], ...]  # (role, path relative to the repository root), hashed after the run
    env: Mapping[str, str] = field(default_factory=dict)
    ok_codes: tuple[int, ...] = (0,)  # the evals exit 1 when their rule fails: a verdict, still a figure
    sealed: bool = False  # reads held-out data that is read once per committed model
    limit_minutes: float = 0.0  # 0: three times the expected minutes
    cuda: bool = False  # runs on a CUDA GPU only: left out of a run of every item on a machine without one
    # A timing whose targets differ by CPU kind: measured only on a CPU where bf16 is native (True), or only on
    # one where it is not (False; dtype auto runs fp32 there); None: on any host. Elsewhere it is left out of a
    # run of every item and refused by name (`wrong_host`): its sibling item measures that kind.
    bf16: bool | None = None
    # What the command measures where the fingerprinted folder only identifies it: the demo items fingerprint
    # the committed generator (`demo/generator`) and measure the model built from it, whose fingerprint is the
    # one a reading of test data records in the ledger (`demo.sealed.unseal`). Called with `build`: whether it
    # may build the model (else None where it is not built).
    measured_model: Callable[[bool], Path | None] | None = None

    @property
    def limit_s(self) -> float:
        return 60 * (self.limit_minutes or 3 * self.minutes)


def demo_model(build: bool) -> Path | None:
    """The demo model the demo items measure: built from the committed generator if `build`, else as built."""
    from gatehead.demo import MODEL_DIR
    from gatehead.demo.base import ensure_demo_model

    return ensure_demo_model() if build else (MODEL_DIR if MODEL_DIR.is_dir() else None)


SEALED_DEMO = {"sealed": True, "measured_model": demo_model}  # an item that reads the demo's test split
DEMO = (("model", DEMO_MODEL), ("adapter", DEMO_ADAPTER))  # the prompt-mode gate
DEMO_DEFAULT = (("model", DEMO_MODEL), ("adapter", DEMO_SUFFIX_ADAPTER))  # the demo's default gate (suffix mode)
DEMO_BOTH = DEMO + (("suffix_adapter", DEMO_SUFFIX_ADAPTER),)
PROMPT_GATE = ("--adapter", DEMO_ADAPTER)  # the evals that judge the prompt-mode gate name it
# The random model is built at run time (`benchmarks.side_by_side.random_model`), and its random draws differ between
# CPU kinds: what identifies it in the repository is its recipe and the builder.
RANDOM = (("recipe", "benchmarks/random-model.json"), ("builder", "tiny.py"))


# The fidelity figures are measured by the tests that judge them: with GATEHEAD_FIGURES_FILE set, their
# `record_figure` fixture (tests/conftest.py) writes each figure and each test's outcome there.
FIGURES_ENV = {"GATEHEAD_FIGURES_FILE": "{out}"}
# The fidelity figures take 256 demo gates and HF fp64 on every one (the suite, on an fp32 host, 128 gates and HF fp64
# on every second: tests/conftest.py).
FIDELITY_ENV = {**SUITE_LAYOUT, **FIGURES_ENV, "GATEHEAD_DEMO_GATES": "256",
                "GATEHEAD_DEMO_FP64_EVERY": "1"}
FIDELITY_TESTS = ("tests/integration/runtime/test_fidelity.py", "tests/integration/runtime/test_fidelity_compile.py",
                  "tests/integration/runtime/test_chunking.py", "tests/integration/runtime/test_demo_fidelity.py",
                  "tests/integration/runtime/test_tensor_parallel.py")


# The demo's turns, timed: `benchmarks/demo_turns.py`, both gate modes, under gatehead's CPU binding and vLLM's.
DEMO_TURNS = ("{python}", "-m", "gatehead.benchmarks.demo_turns", "--setups",
              "suffix,prompt,suffix:vllm-binding,prompt:vllm-binding", "--out", "{out}")


def _pytest(*paths: str) -> tuple[str, ...]:
    return ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths)


def _eval(name: str, *args: str) -> tuple[str, ...]:
    return ("{gatehead}", "eval", name, *args, *EVAL_SIZES, "--ledger", LEDGER, "--out", "{dir}")


def _evaluate(split: str, *args: str) -> tuple[str, ...]:
    return ("{python}", "-m", "gatehead.demo.build", "evaluate", "--split", split, *args, "--device", "cpu",
            "--out", "{out}")


def _bench_random(part: str, minutes: float, *args: str) -> Item:
    return Item(f"bench-random-{part}", f"gatehead bench on the 0.36 B random model (its targets' model): {part}",
                minutes, ("{gatehead}", "bench", "--model", "random", "--block-size", "32", "--memory-fraction", "0.2",
                          *args, "--out", "{out}"), "file", RANDOM)


# The random model's bench (about 6 hours on 2 cores) in parts that fit a session, each every setup over some
# workloads; its page block merges them into one table (`benchmarks.bench_report.merge`): every ratio reads
# one workload, measured within one part. Measure the parts on one host.
BENCH_RANDOM = (_bench_random("c1", 90, "--workloads", "single", "refuse", "--concurrency", "1"),
                _bench_random("c4", 60, "--workloads", "single", "refuse", "--concurrency", "4"),
                _bench_random("c8", 60, "--workloads", "single", "refuse", "--concurrency", "8"),
                _bench_random("threads", 90, "--workloads", "multi"),
                _bench_random("prefix", 60, "--workloads", "prefix", "memory"))

ITEMS: tuple[Item, ...] = (
    Item("eval-stability", "stability eval, demo model, vLLM's default process layout", 15,
         _eval("stability", "--variants", "plain,mixed", *PROMPT_GATE), "dir", DEMO, ok_codes=(0, 1)),
    Item("eval-stability-suite-layout", "stability eval as the test suite runs engines (in-process, 1 thread)", 15,
         _eval("stability", "--variants", "plain,mixed", *PROMPT_GATE), "dir", DEMO, env=SUITE_LAYOUT,
         ok_codes=(0, 1)),
    Item("eval-agreement", "agreement eval (shared vs dedicated vs HF), demo model, default layout", 15,
         _eval("agreement", *PROMPT_GATE), "dir", DEMO, ok_codes=(0, 1)),
    Item("eval-agreement-suite-layout", "agreement eval as the test suite runs engines", 15,
         _eval("agreement", *PROMPT_GATE), "dir", DEMO, env=SUITE_LAYOUT, ok_codes=(0, 1)),
    Item("eval-kv", "KV capacity, stock vs shared, and the plugin's memory", 5, _eval("kv", *PROMPT_GATE), "dir", DEMO,
         ok_codes=(0, 1)),
    Item("eval-dataset-val", "the agent over the demo's validation split", 20,
         _eval("dataset", "--demo", "val"), "dir", DEMO_DEFAULT,
         ok_codes=(0, 1)),
    Item("eval-dataset-test", "the agent over the demo's held-out test split: read once per committed model", 20,
         _eval("dataset", "--demo", "test"), "dir", DEMO_DEFAULT, ok_codes=(0, 1), **SEALED_DEMO),
    Item("eval-threads-test", "the agent over the hand-written threads (test products): read once per committed model",
         8, _eval("threads"), "dir", DEMO_DEFAULT, ok_codes=(0, 1), **SEALED_DEMO),
    Item("demo-val", "the demo kit's figures on its validation split (model and calibration chosen on it), default "
         "gate", 40, _evaluate("val", "--adapter", "adapter-suffix"), "file", DEMO_DEFAULT),
    Item("demo-test", "the demo kit's held-out test figures, default gate: read once per committed model", 45,
         _evaluate("test", "--adapter", "adapter-suffix"), "file", DEMO_DEFAULT, **SEALED_DEMO),
    Item("demo-test-prompt", "the prompt-mode gate alone on the held-out test sets: read once per committed gate", 20,
         _evaluate("test", "--adapter", "adapter", "--gate-only"), "file", DEMO, **SEALED_DEMO),
    Item("agent-ttft", "answer time to first token after the gate vs cold, demo model", 2,
         ("{python}", "-m", "gatehead.benchmarks.agent_ttft", "--block-size", "32"), "stdout", DEMO),
    Item("demo-turns", "the demo as a user meets it on a CPU without native bf16 (fp32; its 2.5 s target): ready, "
         "first turn, gate and answered turn, both gate modes, gatehead's CPU binding and vLLM's", 16, DEMO_TURNS,
         "file", DEMO_BOTH, bf16=False),
    Item("demo-turns-bf16", "the same where bf16 is native (its 1.5 s target)", 10, DEMO_TURNS, "file", DEMO_BOTH,
         bf16=True),
    # Every training and validation question answered greedily and sampled: over 37 minutes in fp32 on 2 AVX2 cores.
    Item("guard-rates", "the degenerate-output guard's rates and engine-fault drill, demo model", 30,
         ("{python}", "-m", "gatehead.benchmarks.guard_rates", "--out", "{out}"), "file", DEMO),
    Item("suffix-latency", "prompt-mode vs suffix-mode gate latency at ~1,900 tokens, demo model", 2,
         ("{python}", "-m", "gatehead.benchmarks.suffix_latency", "--out", "{out}"), "file", DEMO_BOTH),
    Item("fidelity", "fidelity and tensor-parallel tests with their figures (tiny and demo models), as the suite "
         "runs engines", 35, _pytest(*FIDELITY_TESTS), "file", DEMO, env=FIDELITY_ENV,
         ok_codes=(0, 1)),
    Item("fidelity-emulated", "the same as a CPU with AVX-512F and no bf16 computes (GATEHEAD_TEST_CPU_ISA=avx512): "
         "dtype auto runs fp32 there", 35, _pytest(*FIDELITY_TESTS), "file", DEMO,
         env={**FIDELITY_ENV, "GATEHEAD_TEST_CPU_ISA": "avx512"}, ok_codes=(0, 1)),
    Item("fidelity-avx2", "the same as an AVX2 CPU without AVX-512 computes (GATEHEAD_TEST_CPU_ISA=avx2): "
         "dtype auto runs fp32 there, and the fp32 rules are judged", 25, _pytest(*FIDELITY_TESTS), "file", DEMO,
         env={**FIDELITY_ENV, "GATEHEAD_TEST_CPU_ISA": "avx2"}, ok_codes=(0, 1)),
    Item("vllm-serve-demo", "the demo's two gates through a stock `vllm serve` against the in-process engine, the "
         "answer reading the gate's blocks over HTTP, and generation against stock `vllm serve`", 8,
         _pytest("tests/integration/runtime/test_vllm_serve.py", "-k", "equal or prefix_blocks"), "file", DEMO_BOTH,
         env={**SUITE_LAYOUT, **FIGURES_ENV, "GATEHEAD_VLLM_SERVE_MODEL": "demo"}, ok_codes=(0, 1)),
    Item("soak", "the comparing soak: a real server under mixed load and faults for 600 s, then each request alone",
         13, _pytest("tests/integration/server/test_soak.py"), "file", DEMO,
         env={**SUITE_LAYOUT, **FIGURES_ENV, "GATEHEAD_SOAK_SECONDS": "600"}, ok_codes=(0, 1)),
    Item("gpu-branch", "the branch against a dedicated gate at a 27B-like shape, PyTorch alone: needs a CUDA GPU",
         5, ("bash", "-c", "set -e; mkdir -p {dir}; for i in 1 2 3; do {python} -m gatehead.benchmarks.gpu_branch "
             "> {dir}/run$i.json; done; {python} -m gatehead.benchmarks.gpu_branch --combine {dir}/run1.json "
             "{dir}/run2.json {dir}/run3.json > {out}"), "file", (), cuda=True),
    # Memory fraction 0.2 where (b) runs: in fp32 (an AVX2 host) the demo model's engine needs more than half of 0.1.
    Item("bench-demo", "gatehead bench, every setup and workload, demo model", 35,
         ("{gatehead}", "bench", "--model", "demo", "--block-size", "32", "--memory-fraction", "0.2", "--out", "{out}"),
         "file", DEMO_BOTH),
    Item("bench-demo-priority", "the answer after or beside the gate, first come or by priority, demo model", 30,
         ("{gatehead}", "bench", "--model", "demo", "--block-size", "32", "--setups", "a_suffix", "a_overlap",
          "a_suffix_prio", "a_overlap_prio", "c0_stock", "--workloads", "single", "multi", "refuse", "--out", "{out}"),
         "file", DEMO_BOTH),
    Item("bench-demo-remote", "the gate inside vllm serve over HTTP (a'-remote) beside the same gate in process "
         "(a') and two engines (b), demo model", 22,
         ("{gatehead}", "bench", "--model", "demo", "--block-size", "32", "--memory-fraction", "0.2", "--setups",
          "a_suffix", "a_remote", "b_split", "b_shared", "--workloads", "single", "--out", "{out}"), "file",
         DEMO_BOTH),
    *BENCH_RANDOM,
    Item("turn-cost-demo", "where a gated turn's time goes against stock vLLM's: engine steps, prefill, the branch, "
         "front-end CPU per turn, demo model", 15,
         ("{python}", "-m", "gatehead.benchmarks.turn_cost", "--model", "demo", "--out", "{out}"), "file", DEMO_BOTH),
    Item("turn-cost-random", "the same on the 0.36 B random model (its targets' model)", 45,
         ("{python}", "-m", "gatehead.benchmarks.turn_cost", "--model", "random", "--out", "{out}"), "file", RANDOM),
)


def by_name(names: Sequence[str]) -> list[Item]:
    known = {item.name: item for item in ITEMS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown figures item(s) {unknown}; known: {sorted(known)}")
    return [known[n] for n in names]



def wrong_host(item: Item) -> str | None:
    """Why this host does not measure `item` (an item tied to CPUs with or without native bf16), else None."""
    if item.bf16 is None:
        return None
    from gatehead.runtime.dtype import bf16_native, cpu_bf16_path

    if bf16_native() == item.bf16:
        return None
    sibling = [i.name for i in ITEMS if i.argv == item.argv and i.bf16 == (not item.bf16)]
    return (f"{item.name} is measured on a CPU {'with' if item.bf16 else 'without'} native bf16, and this one's bf16 "
            f"path is {cpu_bf16_path()}" + (f" ({sibling[0]} measures this kind)" if sibling else ""))
