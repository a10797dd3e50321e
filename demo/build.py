"""Builds the demo kit, stage by stage: `python -m gatehead.demo.build {generate,label,train,evaluate}`.

- generate: the corpus (`demo/corpus/*.md`) and labelled questions, seeded: in the two templates per
  attribute (`demo/questions.jsonl`) and in people's phrasings, held out by family, with out-of-scope
  messages (`demo/questions-phrased.jsonl`);
- label: retrieves for every question with the real retriever, keeps those whose retrieval behaves
  as the label says, writes `demo/data/{train,val,test}.jsonl`, `demo/data/phrased-{split}.jsonl`
  and, from the hand-written questions (`demo/handwritten.jsonl`), `demo/data/handwritten-test.jsonl` (CPU);
- train-model: a tokenizer and language model trained from scratch, in the stages of `demo_recipe()`,
  written to `<out-dir>/model` (CUDA if present, else CPU): how the 12.8 M model that came before the
  pretrained demo model was made (docs/demo-model-history.md);
- train-gate: the gate adapter on a model (`--model`, default the demo model: the registry's base with the
  committed generator merged, `gatehead.demo.finetune`), calibrated on val: `demo/adapter` and
  `demo/report.json` (the two training stages need PyTorch only);
- evaluate: the figures again, from the committed model and adapter.
The committed outputs make every stage optional for users of the demo.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gatehead.demo import ADAPTER_DIR, DEMO_DIR, SEED, kit_name
from gatehead.demo.splits import DATA_DIR, HANDWRITTEN, handwritten_texts, read_jsonl, training_records, write_jsonl

if TYPE_CHECKING:
    from gatehead.demo.train import LMConfig, ModelSpec
    from gatehead.gate.train import TrainConfig

CORPUS_DIR = DEMO_DIR / "corpus"
QUESTIONS = DEMO_DIR / "questions.jsonl"
PHRASED = DEMO_DIR / "questions-phrased.jsonl"
REPORT = DEMO_DIR / "report.json"
PHRASED_DRAWN = 20  # fresh gibberish and arithmetic messages per split


def generate(corpus_dir: Path = CORPUS_DIR, questions_path: Path = QUESTIONS, phrased_path: Path = PHRASED) -> dict:
    from gatehead.demo.kb import build_kb
    from gatehead.demo.questions import build_questions, phrased_questions

    kb = build_kb(SEED)
    questions = build_questions(kb, SEED)
    phrased = phrased_questions(kb, SEED, drawn=PHRASED_DRAWN)
    if corpus_dir.exists():
        shutil.rmtree(corpus_dir)
    for doc in kb.docs:
        path = corpus_dir / f"{doc.doc_id}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc.markdown(), encoding="utf-8")
    write_jsonl(questions_path, [q.to_dict() for q in questions])
    write_jsonl(phrased_path, [q.to_dict() for q in phrased])
    return {"documents": len(kb.docs), "questions": len(questions), "phrased": len(phrased)}


def label_all(kb, corpus_dir: Path = CORPUS_DIR, data_dir: Path = DATA_DIR) -> dict:
    """The label stage: the template, phrased and hand-written questions against the real retriever."""
    import tempfile

    from gatehead.demo.label import label
    from gatehead.demo.questions import handwritten_questions

    report = {"template": label(kb, corpus_dir, QUESTIONS, data_dir),
              "phrased": label(kb, corpus_dir, PHRASED, data_dir, prefix="phrased-")}
    with tempfile.TemporaryDirectory() as tmp:
        questions = Path(tmp) / "handwritten.jsonl"
        write_jsonl(questions, [q.to_dict() for q in handwritten_questions(kb, read_jsonl(HANDWRITTEN))])
        report["handwritten"] = label(kb, corpus_dir, questions, data_dir, prefix="handwritten-")
    return report


def _relative(path: str | None, root: Path) -> str | None:
    return None if path is None else os.path.relpath(Path(path).resolve(), Path(root).resolve())


def train_model(data_dir: Path = DATA_DIR, out_dir: Path = DEMO_DIR, smoke: bool = False,
                spec: ModelSpec | None = None, config: LMConfig | None = None, root: Path | None = None) -> dict:
    """Tokenizer and language model from the labelled training split plus synthetic knowledge bases.

    `training.json` records `config.init_from` relative to `root` (default `out_dir`), so that no path
    of the machine it was trained on is kept.

    `spec` and `config` default to `ModelSpec()` and `LMConfig()`, one stage of the first demo model's
    recipe; `build_demo_model` runs the committed model's stages. With `config.init_from`, `spec`
    is recorded as given and should describe that model.
    """
    import torch

    from gatehead.demo.tasks import training_examples
    from gatehead.demo.train import LMConfig, ModelSpec, build_demo_tokenizer, encode, new_model, train_lm

    started = time.time()
    spec, config = spec or ModelSpec(), config or LMConfig()
    if smoke:
        config = replace(config, knowledge_bases=2, max_steps=20)
    records = training_records(data_dir, config.phrasings)[:40 if smoke else None]
    examples = training_examples(records, config.knowledge_bases, config.data_seed, config.same_category_negatives,
                                 config.wide_names, config.phrasings, exclude=handwritten_texts())
    model_dir = out_dir / "model"
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    if config.init_from:  # continue a trained model: its tokenizer, its shape, its weights
        from transformers import AutoModelForCausalLM, AutoTokenizer

        source = Path(config.init_from)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(source / name, model_dir / name)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    else:
        # The tokenizer sees training text only: held-out names are split into pieces, as a user's would be.
        if spec.tokenizer_corpus == "real":
            from gatehead.demo.tasks import from_record

            seen = [e for record in records for e in from_record(record)]
        else:
            seen = examples
        texts = [e.question for e in seen] + [e.target for e in seen]
        texts += [p.text for e in seen[:5000] for p in e.passages] + [e.system for e in examples[:10]]
        tokenizer = build_demo_tokenizer(model_dir, texts, spec)
        torch.manual_seed(SEED)
        model = new_model(spec, tokenizer)
    data = encode(examples, tokenizer, spec.max_position, processes=min(16, os.cpu_count() or 1))
    log = train_lm(model, data, tokenizer.pad_token_id, config)
    model.to("cpu", dtype=torch.bfloat16).save_pretrained(model_dir, max_shard_size="15MB")
    report = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "seconds": round(time.time() - started, 1), "model": asdict(spec),
              "config": {**asdict(config), "init_from": _relative(config.init_from, root or out_dir)},
              "steps": log[-1]["step"] if log else 0, "examples": len(examples),
              "real_records": len(records), "log": log}
    (model_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def demo_recipe() -> tuple[ModelSpec, tuple[LMConfig, ...], TrainConfig]:
    """The committed model's recipe: its shape, five training stages (each continuing the one before)
    and the gate's training. `docs/demo-model-history.md` says what each stage changed and what it fixed."""
    from gatehead.demo.train import LMConfig, ModelSpec
    from gatehead.gate.train import TrainConfig

    spec = ModelSpec(num_layers=12, num_heads=8, head_dim=32, num_kv_heads=4, split_digits=True,
                     tokenizer_corpus="real")
    stages = (
        # 400 synthetic knowledge bases seen about once each (one H200: 545 s of training).
        LMConfig(knowledge_bases=400, epochs=4, batch_size=256, learning_rate=1.5e-3, warmup_steps=200,
                 max_steps=4024, same_category_negatives=True),
        # 200 fresh ones at a lower rate (one H200: 289 s).
        LMConfig(knowledge_bases=200, epochs=4, batch_size=256, learning_rate=1e-3, warmup_steps=200,
                 max_steps=2186, same_category_negatives=True, data_seed=7),
        # Then synthetic names of every shape held-out names have, twice on fresh knowledge bases (a
        # 2-core CPU in bf16: 1,321 and 1,335 s of training).
        *(LMConfig(knowledge_bases=4, epochs=4, batch_size=32, learning_rate=3e-4, warmup_steps=49, max_steps=240,
                   same_category_negatives=True, wide_names=True, data_seed=seed, cpu_bf16=True) for seed in (11, 12)),
        # People's phrasings: the phrased training split and 100 fresh knowledge bases asked in the
        # training families, with out-of-scope messages (one H200: 345 s of training).
        LMConfig(knowledge_bases=100, epochs=2, batch_size=256, learning_rate=5e-4, warmup_steps=150,
                 max_steps=2400, same_category_negatives=True, wide_names=True, phrasings=True, data_seed=13),
    )
    gate = TrainConfig(epochs=3, patience=2, batch_size=16, learning_rate=1e-3, seed=SEED)
    return spec, stages, gate


def build_demo_model(data_dir: Path = DATA_DIR, out_dir: Path = DEMO_DIR, smoke: bool = False,
                     first_stage: int = 1) -> dict:
    """`demo_recipe()`'s stages into `out_dir/model`, the earlier ones into `out_dir/stages/<n>/model`.

    With `first_stage` > 1 the stages before it are taken as done: the run continues the model in
    `out_dir/model` (the committed one), and its `training.json` stage records are kept. The final
    `training.json` lists every stage's record under "stages" (its own is the last).
    """
    spec, stages, _ = demo_recipe()
    if not 1 <= first_stage <= len(stages):
        raise ValueError(f"first_stage must be in 1..{len(stages)}, got {first_stage}")
    records: list[dict] = []
    source: Path | None = None
    if first_stage > 1:
        done = json.loads((out_dir / "model" / "training.json").read_text())["stages"]
        if len(done) != first_stage - 1:
            raise ValueError(f"{out_dir / 'model'} records {len(done)} stages; stage {first_stage} continues "
                             f"a model of {first_stage - 1}")
        records = done
        source = out_dir / "stages" / str(first_stage - 1) / "model"
        if source.exists():
            shutil.rmtree(source)
        shutil.copytree(out_dir / "model", source)
    for n, config in enumerate(stages[first_stage - 1:], first_stage):
        stage_dir = out_dir if n == len(stages) else out_dir / "stages" / str(n)
        if source is not None:
            config = replace(config, init_from=str(source))
        report = train_model(data_dir, stage_dir, smoke, spec, config, root=out_dir)
        records.append({k: v for k, v in report.items() if k != "log"})
        source = stage_dir / "model"
    path = out_dir / "model" / "training.json"
    path.write_text(json.dumps({**report, "stages": records}, indent=2) + "\n")
    return {**report, "stages": records}


def _gate_examples(rows: list[dict], name: str) -> list:
    """The gate's examples of labelled rows: a search question, once rewritten and retrieved again, is also an
    answerable one."""
    from gatehead.gate.data import parse_example

    found = [{"question": r["rewrite"], "documents": r["rewrite_documents"], "label": "answer"}
             for r in rows if r["label"] == "search"]
    return [parse_example(r, f"{name}:{i}") for i, r in enumerate(rows + found, 1)]


def train_gate_and_report(data_dir: Path = DATA_DIR, out_dir: Path = DEMO_DIR, smoke: bool = False,
                          config: TrainConfig | None = None, phrasings: bool = True, adapter_name: str = "adapter",
                          read_test: bool = False, answers: bool = True, model_dir: Path | None = None) -> dict:
    """The gate adapter on the model in `out_dir/model` (or `model_dir`), calibrated on val; held-out figures
    on test.

    The adapter goes to `out_dir/<adapter_name>` and the report to `out_dir/report.json` (for another
    name, `report-<adapter_name>.json`). `read_test` also measures it on the test split (through
    `demo.sealed.unseal`, once the adapter exists); by default the test split stays unread.
    `answers=False` measures the gate alone (no replies generated).

    `config` defaults to the committed gate's (`demo_recipe()`). With `phrasings` (the committed gate's
    training; off, the templated splits alone, as before stop 31) the gate also trains on the phrased
    training split and chooses on the phrased validation split (out-of-scope included), and the report
    gives the figures of every validation set (`gatehead.demo.evaluate.evaluate_sets`); test's sets are
    read once, by the evaluate stage.
    """
    import torch

    from gatehead.demo.evaluate import evaluate, evaluate_sets
    from gatehead.demo.sealed import unseal
    from gatehead.demo.train import ModelSpec
    from gatehead.gate.calibrate import calibrate
    from gatehead.gate.data import parse_example
    from gatehead.gate.train import train_gate

    started, device = time.time(), "cuda" if torch.cuda.is_available() else "cpu"
    window = ModelSpec().max_position
    records = {split: training_records(data_dir, phrasings, split)[:40 if smoke else None]
               for split in ("train", "val")}
    model_dir, adapter_dir = model_dir or _demo_model(), out_dir / adapter_name
    config = replace(config or demo_recipe()[2], max_context=window)
    config = replace(config, epochs=2 if smoke else config.epochs)
    result = train_gate(model_dir, _gate_examples(records["train"], "train"), _gate_examples(records["val"], "val"),
                        adapter_dir, config)
    calibration = calibrate(model_dir, adapter_dir, [parse_example(r, f"val:{i}") for i, r in
                                                     enumerate(records["val"], 1)], answer_precision=0.95,
                            max_context=window)
    figures = None
    if read_test:
        test = read_jsonl(unseal(data_dir / "test.jsonl", model_dir, adapter_dir))[:40 if smoke else None]
        figures = evaluate(model_dir, adapter_dir, test, device=device, max_context=window, answers=answers)
    # The evaluation sets of val, to choose by; test's are read once, by the evaluate stage.
    val_sets = {} if smoke or not phrasings else evaluate_sets(model_dir, adapter_dir, data_dir, "val", device, window,
                                                               answers=answers)
    language_model = json.loads((model_dir / "training.json").read_text()) \
        if (model_dir / "training.json").is_file() else {"model": model_dir.name}
    report = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "language_model": {k: v for k, v in language_model.items() if k != "log"},
        "gate_training": {"seconds": round(time.time() - started, 1), "best_epoch": result.best_epoch,
                          "config": asdict(replace(config, progress=False)), "phrasings": phrasings,
                          "val_accuracy": [e.val.accuracy for e in result.epochs]},
        "calibration": calibration.to_dict(),
        **({"test": figures} if figures is not None else {}),
        **({"val_sets": val_sets} if val_sets else {}),
    }
    name = "report.json" if adapter_name == "adapter" else f"report-{adapter_name}.json"
    (out_dir / name).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gatehead.demo.build", description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=["generate", "label", "train-model", "train-gate", "evaluate"])
    parser.add_argument("--out-dir", type=Path, default=DEMO_DIR, help="where train writes model/, adapter/, report")
    parser.add_argument("--smoke", action="store_true", help="a few steps on a few examples: checks the pipeline")
    parser.add_argument("--first-stage", type=int, default=1,
                        help="train-model: continue the committed model from this stage of demo_recipe()")
    parser.add_argument("--templates-only", action="store_true",
                        help="train-gate: on the templated splits alone (the gate before stop 31)")
    parser.add_argument("--split", choices=["val", "test"], default="val",
                        help="evaluate: the split whose evaluation sets are measured (choose on val)")
    parser.add_argument("--out", type=Path, help="evaluate: write the figures to this JSON file")
    parser.add_argument("--model", type=Path, help="train-gate, evaluate: the model (default: the demo model)")
    parser.add_argument("--adapter", default="adapter",
                        help="train-gate, evaluate: the adapter's directory name under --out-dir (demo/)")
    parser.add_argument("--activation", choices=["prompt", "suffix"], default="prompt",
                        help="train-gate: prompt mode (the committed recipe) or an activated gate")
    parser.add_argument("--k", type=int, help="train-gate: layers the gate adapts (default: the recipe's)")
    parser.add_argument("--rank", type=int, help="train-gate: LoRA rank (default: the recipe's)")
    parser.add_argument("--suffix-length", type=int, default=1, help="train-gate, suffix mode: invocation tokens")
    parser.add_argument("--gate-only", action="store_true",
                        help="train-gate, evaluate: the gate's figures alone (no replies generated)")
    parser.add_argument("--test", action="store_true",
                        help="train-gate: also measure the gate on the test split (read once per committed model; "
                        "by default only validation is read)")
    parser.add_argument("--device", default=None, help="evaluate: cuda or cpu (default: cuda if present)")
    args = parser.parse_args(argv)
    if args.stage == "generate":
        print(json.dumps(generate()))
    elif args.stage == "label":
        from gatehead.demo.kb import build_kb

        print(json.dumps(label_all(build_kb(SEED)), indent=2))
    elif args.stage == "train-model":
        report = build_demo_model(out_dir=args.out_dir, smoke=args.smoke, first_stage=args.first_stage)
        print(json.dumps([{k: stage[k] for k in ("seconds", "examples", "steps")} for stage in report["stages"]]))
    elif args.stage == "train-gate":
        recipe = demo_recipe()[2]
        rank = args.rank or recipe.rank
        config = replace(recipe, activation=args.activation, suffix_length=args.suffix_length,
                         k=args.k or recipe.k, rank=rank, alpha=recipe.alpha * rank / recipe.rank)  # the recipe's ratio
        report = train_gate_and_report(out_dir=args.out_dir, smoke=args.smoke, phrasings=not args.templates_only,
                                       config=config, adapter_name=args.adapter, read_test=args.test,
                                       answers=not args.gate_only, model_dir=args.model)
        print(json.dumps(report.get("test") or report.get("val_sets"), indent=2, ensure_ascii=False))
    else:
        figures = evaluate_stage(args.split, args.out, args.device, args.out_dir / args.adapter,
                                 answers=not args.gate_only, model_dir=args.model)
        print(json.dumps(figures, indent=2, ensure_ascii=False))
    return 0


def evaluate_stage(split: str, out: Path | None = None, device: str | None = None,
                   adapter_dir: Path = ADAPTER_DIR, answers: bool = True, model_dir: Path | None = None) -> dict:
    """The evaluate stage: every evaluation set of `split` on the committed model and gate, with what
    identifies them (file hashes); written to `out` when given."""
    import hashlib

    import torch

    from gatehead.demo.evaluate import evaluate_sets

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.time()
    model_dir = model_dir or _demo_model()
    figures = evaluate_sets(model_dir, adapter_dir, DATA_DIR, split, device, answers=answers)
    weights = sorted(model_dir.glob("*.safetensors")) + [adapter_dir / "adapter_model.safetensors"]
    named = ("" if adapter_dir.name == "adapter" else f" --adapter {adapter_dir.name}") + \
        ("" if answers else " --gate-only")
    result = {"command": f"python -m gatehead.demo.build evaluate --split {split}{named}", "split": split,
              "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
              "seconds": round(time.time() - started, 1),
              "weights_sha256": {kit_name(p): hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in weights},
              "sets": figures}
    if out is not None:
        _write_json(out, result)
    return result


def _demo_model() -> Path:
    """The demo model, built on first use."""
    from gatehead.demo.base import ensure_demo_model

    return ensure_demo_model()


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
