#!/bin/bash
# The demo evals on the committed model (README "Evals" table): bash evals/demo-evals.sh from the repository root.
set -x
G=.venv/bin/gatehead; O=evals/demo-results; L=evals/demo-ledger.jsonl
A="--max-model-len 2048 --block-size 32 --ledger $L"
rm -rf $O/stability $O/stability-2 $O/agreement $O/kv $O/dataset
$G eval stability --variants plain,mixed $A --out $O/stability
$G eval agreement $A --out $O/agreement
$G eval kv $A --out $O/kv
$G eval dataset --demo $A --out $O/dataset
