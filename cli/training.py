"""Making a gate: `train-gate` (LoRA on the last k layers and the head, from labelled JSONL) and `calibrate`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gatehead.cli.common import chosen_model, model_locations


def _train_gate(args: argparse.Namespace) -> int:
    from gatehead.gate.data import read_examples
    from gatehead.gate.train import TrainConfig, train_gate

    train, val = read_examples(args.train), read_examples(args.val)  # all input checked before training
    config = TrainConfig(k=args.k, rank=args.rank, alpha=args.alpha, learning_rate=args.lr, epochs=args.epochs,
                         batch_size=args.batch_size, patience=args.patience, seed=args.seed,
                         max_context=args.max_context, device=args.device, activation=args.activation,
                         suffix_length=args.suffix_length)
    result = train_gate(chosen_model(args.model), train, val, args.out, config)
    best = result.epochs[result.best_epoch]
    print(f"wrote {result.adapter.path} (epoch {result.best_epoch}: val loss {best.val_loss:.4f}, "
          f"accuracy {best.val.accuracy:.3f}, recall {best.val.recall})")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from gatehead.gate.calibrate import calibrate
    from gatehead.gate.data import read_examples

    locations = model_locations()
    report = calibrate(chosen_model(args.model), args.adapter or locations["adapter"],
                       read_examples(args.val), answer_precision=args.answer_precision)
    print(json.dumps(report.to_dict(), indent=2))
    if not report.target_met:
        print(f"no threshold reaches answer precision {args.answer_precision}: answering is off "
              f"(t_answer = 1.0)", file=sys.stderr)
    return 0


def add_parsers(commands) -> None:
    p = commands.add_parser("train-gate", help="train a gate adapter from labelled JSONL")
    p.add_argument("--train", required=True, type=Path, help="JSONL: question, documents, label[, conversation]")
    p.add_argument("--val", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path, help="adapter directory to write")
    p.add_argument("--model", help="base model directory (default: GATEHEAD_MODEL, else the demo model)")
    p.add_argument("--k", type=int, default=4, help="layers the gate does not share with the base")
    p.add_argument("--activation", choices=["prompt", "suffix"], default="prompt",
                   help="prompt: LoRA on every row of the gate prompt; suffix: on the invocation suffix's rows only "
                        "(an activated gate, which reads the prefix cache)")
    p.add_argument("--suffix-length", type=int, default=1,
                   help="suffix mode: reserved tokens in the invocation suffix (the rows the LoRA adapts)")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16.0)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-context", type=int)
    p.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    p.set_defaults(func=_train_gate)

    p = commands.add_parser("calibrate", help="fit the gate's temperature and thresholds on a validation set")
    p.add_argument("--val", required=True, type=Path)
    p.add_argument("--answer-precision", type=float, default=0.95, help="target precision of 'answer'")
    p.add_argument("--model", help="base model directory (default: GATEHEAD_MODEL, else the demo model)")
    p.add_argument("--adapter", help="gate adapter directory, updated in place")
    p.set_defaults(func=_calibrate)

