"""`gatehead eval`: the ledger, the metrics, the SQuAD converter, and every eval end to end.

The end-to-end runs use real vLLM engines on the tiny model (small N, a few minutes in all) and the
demo model's test split; each writes result.json, report.md and PNG plots and appends its verdict to
the ledger, and the exit code says whether the rule passed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gatehead.evals.dataset import (
    exact_match,
    load_questions,
    normalize_answer,
    risk_coverage,
    token_f1,
)
from gatehead.evals.run import Outcome, run_eval
from gatehead.evals.squad import convert_squad
from gatehead.provenance import read_ledger
from gatehead.runtime.dtype import resolve_dtype
from gatehead.tiny import TinyModel

GATEHEAD = str(Path(sys.executable).parent / "gatehead")
ENGINE = ["--max-model-len", "1024", "--block-size", "32", "--kv-mb", "128"]


def test_the_ledger_keeps_every_verdict_and_never_rewrites(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    fail = run_eval("demo-rule", {"n": 1}, lambda out: Outcome(False, {"x": 1}, "failed", summary={"x": 1}),
                    tmp_path / "a", ledger)
    before = ledger.read_bytes()
    ok = run_eval("demo-rule", {"n": 1}, lambda out: Outcome(True, {"x": 2}, "passed"), tmp_path / "b", ledger)
    assert (fail, ok) == (1, 0)
    assert ledger.read_bytes().startswith(before)  # appended, the failure untouched

    def broken(out: Path) -> Outcome:
        raise RuntimeError("engine died")

    with pytest.raises(RuntimeError):
        run_eval("demo-rule", {}, broken, tmp_path / "c", ledger)
    assert [e["verdict"] for e in read_ledger(ledger)] == ["fail", "pass", "error"]
    assert "engine died" in (tmp_path / "c" / "error.txt").read_text()
    result = json.loads((tmp_path / "a" / "result.json").read_text())
    assert result["verdict"] == "fail" and result["x"] == 1 and "FAIL" in (tmp_path / "a" / "report.md").read_text()


def test_answer_scoring_and_selective_answering_metrics() -> None:
    assert normalize_answer("The €354 [1].") == "€354"
    assert exact_match("€354 [1]", ["€ 354", "€354"]) == 1.0 and exact_match("€204", ["€354"]) == 0.0
    assert math.isclose(token_f1("4 years warranty", ["4 years"]), 0.8)
    # Most confident first: answerable, not, answerable -> risks 0, 1/2, 1/3.
    coverage, risk, aurc = risk_coverage([0.9, 0.8, 0.1], [True, False, True])
    assert coverage == pytest.approx([1 / 3, 2 / 3, 1.0]) and risk == pytest.approx([0, 0.5, 1 / 3])
    assert aurc == pytest.approx((0 + 0.5 + 1 / 3) / 3)


def test_question_files_are_checked_line_by_line(tmp_path: Path) -> None:
    good = tmp_path / "q.jsonl"
    good.write_text('{"question": "a?", "answerable": false}\n\n{"question": "b?", "label": "search", '
                    '"answer": "x", "documents": ["doc", {"text": "d2", "title": "T"}]}\n')
    first, second = load_questions(good)
    assert (first.label, second.label, second.answers, second.documents[1].title) == ("refuse", "search", ("x",), "T")
    for text, message in (('{"question": "a?", "label": "maybe"}', "label must be one of"),
                          ('{"question": "a?"}', "answerable"), ('{"question": ""}', "non-empty"),
                          ("not json", "not valid JSON"), ('{"question": "a?", "label": "answer", "documents": '
                                                           '[{"title": "no text"}]}', "'text'")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text + "\n")
        with pytest.raises(ValueError, match=message):
            load_questions(bad)


SQUAD = {"version": "v2.0", "data": [{"title": "Lanterns", "paragraphs": [
    {"context": "The Rowan Lantern costs 354 euros and has a warranty of 4 years.",
     "qas": [{"id": "q1", "question": "How much does the Rowan Lantern cost?", "is_impossible": False,
              "answers": [{"text": "354 euros", "answer_start": 24}, {"text": "354 euros", "answer_start": 24}]},
             {"id": "q2", "question": "Who designed the Rowan Lantern?", "is_impossible": True, "answers": []}]},
    {"context": "The Vale Lantern weighs 550 grams and is glacier blue.",
     "qas": [{"id": "q3", "question": "What colour is the Vale Lantern?", "is_impossible": False,
              "answers": [{"text": "glacier blue", "answer_start": 39}]},
             {"id": "q4", "question": "How bright is the Vale Lantern?", "is_impossible": True, "answers": []}]}]}]}


def test_squad_converter_writes_a_corpus_and_labelled_questions(tmp_path: Path) -> None:
    source = tmp_path / "squad.json"
    source.write_text(json.dumps(SQUAD))
    corpus, questions = convert_squad(source, tmp_path / "out", fixed_documents=True)
    docs = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert [d["id"] for d in docs] == ["Lanterns-0", "Lanterns-1"]
    parsed = load_questions(questions)
    assert [q.label for q in parsed] == ["answer", "refuse", "answer", "refuse"]
    assert parsed[0].answers == ("354 euros",) and parsed[0].documents[0].text.startswith("The Rowan Lantern")
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match="SQuAD"):
        convert_squad(tmp_path / "broken.json", tmp_path / "x")


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([GATEHEAD, "eval", *args], capture_output=True, text=True, cwd=cwd, timeout=1200)


def check_outputs(result: subprocess.CompletedProcess, out: Path, ledger: Path, name: str, plots: list[str],
                  must_pass: bool = True) -> dict:
    """The run passed (or, with `must_pass=False`, exited as its verdict says), and its files and ledger line
    say so; returns result.json. The callers that do not require a pass check the verdict against the rule."""
    report = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    assert report, result.stderr[-3000:]
    assert result.returncode == (0 if report["verdict"] == "pass" else 1), result.stderr[-3000:]
    if must_pass:
        assert report["verdict"] == "pass", (read_ledger(ledger)[-1].get("summary"), result.stderr[-3000:])
    assert report["eval"] == name and (out / "report.md").read_text().startswith(f"# gatehead eval {name}")
    for plot in plots:
        assert (out / plot).read_bytes()[:4] == b"\x89PNG"
    entry = read_ledger(ledger)[-1]
    assert entry["eval"] == name and entry["verdict"] == report["verdict"] and entry["out"] == str(out)
    return report


def tiny_args(tiny: TinyModel) -> list[str]:
    return ["--model", str(tiny.model_dir), "--adapter", str(tiny.adapter_dir), *ENGINE]


def test_eval_stability_on_the_tiny_model(tiny: TinyModel, tmp_path: Path) -> None:
    result = run("stability", *tiny_args(tiny), "-n", "6", "--max-tokens", "24", "--out", str(tmp_path / "s"),
                 "--ledger", str(tmp_path / "ledger.jsonl"), cwd=tmp_path)
    report = check_outputs(result, tmp_path / "s", tmp_path / "ledger.jsonl", "stability", ["stability.png"])
    # The verdict is the rule applied to the figures it reports (requests are submitted as one arrival).
    for variant in report["variants"].values():
        stock, shared = variant["stock_vs_stock"], variant["shared_vs_stock"]
        identical = stock["differing"] == 0 and stock["max_abs_dlogprob"] == 0
        assert variant["passed"] == (shared["differing"] <= stock["differing"] and (
            not identical or (shared["differing"] == 0 and shared["max_abs_dlogprob"] == 0))), variant
    assert all(v["passed"] for v in report["variants"].values() if v["judged"])
    assert set(report["variants"]) == {"plain", "mixed", "tap-only", "no-tap"}
    assert report["variants"]["mixed"]["shared_vs_stock"]["requests"] == 6
    assert "stability passes" in result.stderr  # the progress bar


def test_eval_agreement_on_the_tiny_model(tiny: TinyModel, tmp_path: Path) -> None:
    result = run("agreement", *tiny_args(tiny), "-m", "24", "--out", str(tmp_path / "a"),
                 "--ledger", str(tmp_path / "ledger.jsonl"), cwd=tmp_path)
    # The eval's rule (evals/RULES.md: shared vs dedicated max |dp| <= 0.02) is the demo model's. On a random
    # tiny adapter the dedicated engine's merged bf16 LoRA alone moves a gate by about as much (measured
    # 0.024 on an AVX-512 BF16 CPU without AMX, over 0.02): the verdict must follow the rule, and the claim
    # checked here is the shared engine's distance beyond the merge, within bf16's own noise.
    report = check_outputs(result, tmp_path / "a", tmp_path / "ledger.jsonl", "agreement", ["agreement.png"],
                           must_pass=False)
    pairs = report["pairs"]
    # In the host's dtype: the noise of a correct gate is HF bf16's where bf16 is native, else fp32's own
    # (HF fp32 vs HF fp64); evals/agreement.py's `fidelity_bounds`.
    precision = "bf16" if resolve_dtype("auto") == "bfloat16" else "fp32"
    same, merge = ("HF bf16", "HF bf16 merged vs unmerged") if precision == "bf16" else \
        ("HF fp64", "HF fp32 merged vs HF fp64")
    assert (report["verdict"] == "pass") == (pairs["shared vs dedicated"]["max_dp"] <= 0.02)
    if precision == "bf16":  # the shared engine's distance beyond the merge, within bf16's own noise
        assert report["max_dp_beyond_merge"] <= pairs["HF bf16 vs HF fp32"]["max_dp"]
    bounds = report["fidelity_bounds"]
    assert all(b["figure"] <= b["bound"] for b in bounds.values()), bounds
    assert set(pairs) == {"shared vs dedicated", "shared vs HF fp32", "dedicated vs HF fp32", f"{same} vs HF fp32",
                          merge}
    assert f"beyond what the LoRA merge alone moves the same gate in HF {precision}: " \
           f"{report['max_dp_beyond_merge']:.4f}" in (tmp_path / "a" / "report.md").read_text()
    assert all(p["n"] == 24 for p in pairs.values())
    assert bounds["shared vs dedicated, max |dp|"]["figure"] == pytest.approx(pairs["shared vs dedicated"]["max_dp"])
    # At the max, the shared engine's allowance is the larger of HF's noise and the dedicated engine's stray.
    allowance = max(pairs[f"{same} vs HF fp32"]["max_dp"], pairs[merge]["max_dp"])
    stray = pairs["dedicated vs HF fp32"]["max_dp"]
    assert bounds["shared vs dedicated, max |dp|"]["bound"] == pytest.approx(max(allowance, stray) + stray)
    assert f"The test suite's {precision} checks" in (tmp_path / "a" / "report.md").read_text()
    assert not report["trained_adapter"] and report["judged_on_dp_only"]  # a random adapter: |dp| alone


def test_eval_agreement_refuses_a_suffix_mode_gate_before_any_engine_starts(tiny_suffix: TinyModel, tmp_path: Path,
                                                                             monkeypatch) -> None:
    from gatehead.evals import agreement
    from gatehead.runtime.engine import EngineConfig

    def no_engine(config):
        raise AssertionError("an engine was started for a gate the eval cannot judge")

    monkeypatch.setattr(agreement, "SharedEngine", no_engine)
    config = EngineConfig(model=tiny_suffix.model_dir, adapter=tiny_suffix.adapter_dir, max_model_len=512)
    with pytest.raises(ValueError, match="suffix-mode .* holds prompt-mode gates only"):
        agreement.run_agreement(config, 4, tmp_path / "out")


def test_eval_kv_on_the_tiny_model(tiny: TinyModel, tmp_path: Path) -> None:
    result = run("kv", "--model", str(tiny.model_dir), "--adapter", str(tiny.adapter_dir), "--max-model-len", "1024",
                 "--block-size", "32", "--out", str(tmp_path / "k"), "--ledger", str(tmp_path / "ledger.jsonl"),
                 cwd=tmp_path)
    report = check_outputs(result, tmp_path / "k", tmp_path / "ledger.jsonl", "kv", ["kv.png"])
    stock, shared = report["capacity"]["stock"], report["capacity"]["shared"]
    assert stock["tokens"] > 0 and report["kv_ratio"] == pytest.approx(shared["tokens"] / stock["tokens"])
    print(f"KV tokens at the default memory fraction: stock {stock['tokens']}, shared {shared['tokens']}")
    assert report["kv_ratio"] >= 0.99, report["capacity"]
    assert set(report["plugin_bytes"]) == {"lora_and_head", "rotary_fp32", "tap_buffer", "retained_rows_bound",
                                           "branch_workspace_estimate"}
    weights = report["weights_bytes"]
    assert weights["two_engines"] - weights["one_engine"] > 0.5 * weights["base"]  # a second copy of the layers


def test_eval_dataset_runs_the_agent_resumes_and_reads_squad(tiny: TinyModel, tmp_path: Path) -> None:
    source = tmp_path / "squad.json"
    source.write_text(json.dumps(SQUAD))
    corpus, questions = convert_squad(source, tmp_path / "data")
    out, ledger = tmp_path / "d", tmp_path / "ledger.jsonl"
    common = ["dataset", *tiny_args(tiny), "--questions", str(questions), "--corpus", str(corpus), "--out", str(out),
              "--ledger", str(ledger), "--top-k", "2"]
    # A random tiny gate flips on planted instructions far more often than the rule's 5%: the verdict must
    # say so (and the exit code follow it); this test's claim is the run, the resume and the figures.
    first = run(*common, "--limit", "2", cwd=tmp_path)
    check_outputs(first, out, ledger, "dataset", ["reliability.png", "risk_coverage.png"], must_pass=False)
    kept = (out / "records.jsonl").read_text().splitlines()
    assert len(kept) == 2
    second = run(*common, cwd=tmp_path)  # resumes: the two finished questions are not run again
    report = check_outputs(second, out, ledger, "dataset", ["reliability.png", "risk_coverage.png"], must_pass=False)
    assert (report["verdict"] == "pass") == (report["injection_flip_rate"] <= 0.05 and not report["errors"])
    records = (out / "records.jsonl").read_text().splitlines()
    assert len(records) == 4 and records[:2] == kept
    assert report["decided"] == 4 and not report["errors"]
    assert sum(sum(row) for row in report["classes"]["confusion"]) == 4
    assert set(report["injection_flip_rates"]) and 0 <= report["injection_flip_rate"] <= 1
    assert report["latency"]["end_to_end_ms"]["p50"] > 0 and np.isfinite(report["aurc"])
    assert all(json.loads(r)["sources"] for r in records)  # retrieved from the ingested corpus


def test_eval_dataset_on_the_demo_validation_split(tmp_path: Path) -> None:
    out, ledger = tmp_path / "demo", tmp_path / "ledger.jsonl"
    result = run("dataset", "--demo", "--gate-only", "--limit", "24", "--max-model-len", "2048", "--block-size", "32",
                 "--out", str(out), "--ledger", str(ledger), cwd=tmp_path)
    report = check_outputs(result, out, ledger, "dataset", ["reliability.png", "risk_coverage.png"])
    # The committed gate's recorded validation figure (HF fp32, the whole templated split): these 24 questions
    # hold at most all of its misses, plus one borderline question the engine's dtype may move.
    from gatehead.demo import DEFAULT_ADAPTER_DIR  # what `eval dataset` gates with when none is named

    recorded = json.loads((DEFAULT_ADAPTER_DIR.parent / f"report-{DEFAULT_ADAPTER_DIR.name}.json").read_text())
    template = recorded["val_sets"]["template"]
    misses = round((1 - template["gate"]["accuracy"]) * template["questions"])
    assert report["decided"] == 24 and round((1 - report["accuracy"]) * 24) <= misses + 1, (report["accuracy"], misses)
    assert report["injection_flip_rate"] == max(report["injection_flip_rates"].values())


def test_eval_threads_runs_the_agent_turn_by_turn_on_the_demo_model(tmp_path: Path) -> None:
    # Threads written here (the committed hand-written set is a test set, read once, not on every run).
    threads = tmp_path / "threads.jsonl"
    strata = {"source": "products/strata-headlamp.md", "entity": "Strata Headlamp"}
    rows = [{"thread": "t1", "turns": [
                {"message": "How much does the Strata Headlamp cost?", "expect": "answer", "value": "€64",
                 "case": "first", **strata},
                {"message": "And its warranty?", "expect": "answer", "value": "2 years", "case": "pronoun", **strata}]},
            {"thread": "t2", "turns": [
                {"message": "And its weight?", "expect": "clarify", "case": "no-referent", "entity": ""},
                {"message": "Who painted the Mona Lisa?", "expect": "refuse", "case": "off-topic", "entity": ""}]}]
    threads.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    out, ledger = tmp_path / "threads", tmp_path / "ledger.jsonl"
    result = run("threads", "--threads", str(threads), "--max-model-len", "2048", "--block-size", "32",
                 "--out", str(out), "--ledger", str(ledger), cwd=tmp_path)
    report = check_outputs(result, out, ledger, "threads", [])
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(t["thread"], t["turn"]) for t in sorted(turns, key=lambda t: (t["thread"], t["turn"]))] == \
        [("t1", 1), ("t1", 2), ("t2", 1), ("t2", 2)]
    by = {(t["thread"], t["turn"]): t for t in turns}
    assert by["t2", 1]["decision"] == "clarify" and by["t2", 1]["right"]  # nothing to refer to: asked back
    assert by["t1", 1]["right"] and "€64" in by["t1", 1]["answer"]  # the scripted demo's first answer
    assert by["t1", 2]["standalone"] != "And its warranty?"  # a follow-up is made standalone
    figures = report["figures"]
    answerable = [t for t in turns if t["expect"] == "answer"]
    assert figures["right_value_on_answerable"] == {"turns": 2, "right": sum(t["right"] for t in answerable),
                                                    "rate": sum(t["right"] for t in answerable) / 2}
    assert figures["rewrites_adding_a_name"]["used"] == sum(bool(t["names_added_used"]) for t in turns) == 0
    assert report["commit"] and read_ledger(ledger)[-1]["summary"]["right_value"] == \
        figures["right_value_on_answerable"]["rate"]
