"""The `gatehead` console script, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from gatehead.tiny import TinyModel

GATEHEAD = str(Path(sys.executable).parent / "gatehead")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([GATEHEAD, *args], capture_output=True, text=True, env=env, timeout=300)


def test_info_reports_versions_device_and_model_locations(tmp_path: Path) -> None:
    env = {**os.environ, "GATEHEAD_MODEL": str(tmp_path / "m"), "GATEHEAD_ADAPTER": str(tmp_path / "a")}
    result = run("info", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["packages"]["torch"] == metadata.version("torch")
    assert report["packages"]["vllm"].startswith("0.32.")
    assert report["device"]["kind"] in ("cpu", "cuda")
    if report["device"]["kind"] == "cpu":  # what the host offers, or what GATEHEAD_TEST_CPU_ISA emulates
        flags = Path("/proc/cpuinfo").read_text()
        native = "AMX" if "amx_bf16" in flags else "AVX-512 BF16" if "avx512_bf16" in flags else "emulated"
        emulated = os.environ.get("GATEHEAD_TEST_CPU_ISA", "native") != "native"
        expected = "emulated" if emulated else native
        assert report["device"]["bf16"] == expected, report["device"]
        # dtype auto: bf16 where the CPU computes it, fp32 where it would emulate it
        assert report["device"]["dtype"].startswith("float32" if expected == "emulated" else "bfloat16")
    assert report["vllm_plugin"] == ["gatehead = gatehead.runtime.plugin:register"]
    assert report["models"]["model"] == str(tmp_path / "m") and report["models"]["adapter"] == str(tmp_path / "a")
    text = run("info", env=env).stdout
    assert "transformers" in text and "bf16=" in text and str(tmp_path / "m") in text


def test_gate_on_the_engine_and_the_reference_print_the_same_decision(tiny: TinyModel) -> None:
    # Both in fp32 on every host: the suite's fp32 rule holds a gate within 1e-4 of HF fp32 (docs/testing.md),
    # so the decision and the probabilities printed must agree; bf16's bounds are measured by the fidelity tests.
    args = ["gate", "--model", str(tiny.model_dir), "--adapter", str(tiny.adapter_dir), "--dtype", "float32",
            "--question", "How long is the warranty?", "--doc", "Two years."]
    engine, reference = run(*args), run(*args, "--engine", "hf")
    assert engine.returncode == 0 and reference.returncode == 0, engine.stderr[-2000:] + reference.stderr[-2000:]
    out, ref = json.loads(engine.stdout), json.loads(reference.stdout)
    assert set(out["probs"]) == {"answer", "refuse", "search"} and out["decision"] == ref["decision"]
    assert max(abs(out["probs"][k] - ref["probs"][k]) for k in out["probs"]) <= 1e-4
    forced = json.loads(run(*args, "--engine", "hf", "--t-answer", "0", "--t-refuse", "0").stdout)
    assert forced["decision"] == "answer" and forced["probs"] == ref["probs"]


def test_generate_prints_completions_the_gate_leaves_unchanged(tiny: TinyModel) -> None:
    args = ["generate", "--model", str(tiny.model_dir), "--adapter", str(tiny.adapter_dir), "--max-tokens", "6",
            "--json", "How long is the warranty?", "Reset the router"]
    gated, stock = run(*args), run(*args, "--no-gate")
    assert gated.returncode == 0 and stock.returncode == 0, gated.stderr[-2000:] + stock.stderr[-2000:]
    lines = [json.loads(line) for line in gated.stdout.splitlines()]
    assert len(lines) == 2 and all(0 < line["tokens"] <= 6 for line in lines)
    assert gated.stdout == stock.stdout  # the same base model, with and without the gate branch
    # The engine is shut down once: none outlives it to fail at interpreter exit (runtime/engine.py, `_start`).
    assert "Exception ignored" not in gated.stderr + stock.stderr, gated.stderr[-2000:]


def test_bad_input_exits_2_with_the_fix(tiny: TinyModel, tiny_other: TinyModel) -> None:
    bad = run("gate", "--model", str(tiny.model_dir), "--adapter", str(tiny.adapter_dir),
              "--question", "q", "--t-answer", "1.5")
    assert bad.returncode == 2 and "threshold 'answer' must be a number in [0, 1]" in bad.stderr
    wrong = run("gate", "--model", str(tiny_other.model_dir), "--adapter", str(tiny.adapter_dir), "--question", "q")
    assert wrong.returncode == 2 and "wrong base model" in wrong.stderr
    for args, message in ((["--adapter", str(tiny.adapter_dir)], "--adapter goes with --model PATH"),
                          (["--concurrency", "1", "0"], "--concurrency values must be >= 1"),
                          (["--suffix-adapter", str(tiny.adapter_dir)], "--suffix-adapter goes with --model PATH"),
                          (["--runs", "0"], "--runs must be >= 1"),
                          (["--cores", "0"], "split needs at least 2 cores")):
        bench = run("bench", *args)
        assert bench.returncode == 2 and message in bench.stderr, bench.stderr
        assert "Loading weights" not in bench.stderr  # refused before any model is loaded


def test_export_dedicated_writes_a_stock_classifier(tiny: TinyModel, tmp_path: Path) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification

    from gatehead.gate.reference import HFReference

    out = tmp_path / "dedicated"
    result = run("export-dedicated", str(out), "--model", str(tiny.model_dir), "--adapter", str(tiny.adapter_dir),
                 "--dtype", "float32")
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForSequenceClassification"]
    assert config["id2label"] == {"0": "answer", "1": "refuse", "2": "search"}
    assert (out / "tokenizer.json").exists() and not list(out.glob("adapter_*"))
    ids = HFReference(tiny.model_dir).tokenizer.encode("How long is the warranty?<|gate|>")
    merged = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        probs = merged(input_ids=torch.tensor([ids])).logits.softmax(-1)[0].numpy()
    reference = HFReference(tiny.model_dir, tiny.adapter_dir).gate_probs([ids])[0]
    assert np.abs(probs - reference).max() < 1e-5  # merged in fp32 = unmerged in fp32
    missing = run("export-dedicated", str(tmp_path / "x"), "--model", str(tiny.model_dir), "--adapter",
                  str(tmp_path / "nope"))
    assert missing.returncode == 2 and "has no adapter_config.json" in missing.stderr


def test_demo_runs_the_agent_over_scripted_questions(tmp_path: Path) -> None:
    # In a fresh directory: the demo index is built on first use in .cache/qdrant.
    result = subprocess.run([GATEHEAD, "demo"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    print(out)
    assert "260 added" in result.stderr and (tmp_path / ".cache" / "qdrant").is_dir()
    assert (tmp_path / ".cache" / "threads.sqlite").is_file()
    turns = out.split("\n> ")[1:]
    assert len(turns) == 10
    strata, warranty, switch, by_code, ghost, world, typed, task, support, nothing = turns
    assert "gate:       answer" in strata and "answer:     €64 [1]" in strata
    assert "decision:   answer, grounded in the cited passage" in strata  # €64 is in the passage [1] names
    assert "reused from the gate's prefill" in strata
    assert "standalone: What is the warranty of the Strata Headlamp?" in warranty and "2 years [1]" in warranty
    assert "gate:       search" in by_code and "rewritten:  What is the price of the Strata Headlamp?" in by_code
    assert by_code.count("gate:") == 2 and "answer:     €64 [1]" in by_code
    assert "gate:       refuse" in ghost and "decision:   refuse (gate)" in ghost
    assert "decision:   refuse" in world  # out of scope for this knowledge base
    assert "gate:       answer" in typed and "answer:     920 g [1]" in typed  # a held-out phrasing family
    assert "decision:   refuse" in task
    # Another product, named in a follow-up: what retrieval is asked names it, whether the model's rewrite
    # kept the name or the agent's safeguard replaced a rewrite that lost it (shown as "not used").
    standalone = next(line for line in switch.splitlines() if line.strip().startswith("standalone:"))
    assert "Vale Lantern" in standalone and "products/vale-lantern.md" in switch
    assert "support/strata-headlamp.md" in support and "answer:     9 seconds [1]" in support
    assert "decision:   clarify" in nothing and "Which product do you mean?" in nothing and "gate:" not in nothing
    table = out[out.index("#  | question"):]
    assert "search > answer" in table and "clarify 1" in table


def test_chat_then_ask_continue_one_thread(tmp_path: Path) -> None:
    chat = subprocess.run([GATEHEAD, "chat"], input="How much does the Strata Headlamp cost?\nAnd its warranty?\n",
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert chat.returncode == 0, chat.stderr[-3000:]
    print(chat.stdout)
    thread = chat.stdout.split()[1]
    assert "[gate: answer" in chat.stdout and "€64 [1]" in chat.stdout
    assert "[standalone: What is the warranty of the Strata Headlamp?]" in chat.stdout and "2 years [1]" in chat.stdout
    assert "[sources: products/strata-headlamp.md" in chat.stdout
    ask = subprocess.run([GATEHEAD, "ask", "--json", "--thread", thread, "What about its colour?"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert ask.returncode == 0, ask.stderr[-3000:]
    turn = json.loads(ask.stdout)
    assert turn["thread_id"] == thread and "Strata Headlamp" in turn["standalone"]  # read the earlier turns
    assert turn["decision"] in ("answer", "refuse", "not_found") and turn["sources"]
    assert (turn["grounded"] is None) == (turn["decision"] != "answer")  # checked for an answer only
    assert set(turn["gates"][0]["probs"]) == {"answer", "refuse", "search"}
    bad = subprocess.run([GATEHEAD, "ask", "  ", "--max-searches", "-1"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "max_searches must be >= 0" in bad.stderr
