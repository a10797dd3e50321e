"""CUDA check of gatehead's PyTorch-only paths (no vLLM): HF reference on CUDA vs CPU, gate training on CUDA.

Run by hand on a CUDA machine with torch, transformers and peft: `python benchmarks/cuda_paths.py`.
Prints JSON: fp32 gate probabilities CUDA vs CPU, bf16 CUDA vs fp32 CPU, greedy equality, and a short
training run's validation losses on a tiny model. It measures; it asserts nothing.
"""

import json
import random
import time

import numpy as np
import torch

from gatehead.evals.workload import synthetic_requests
from gatehead.gate.data import parse_example
from gatehead.gate.prompt import PromptBuilder, PromptConfig
from gatehead.gate.reference import HFReference
from gatehead.gate.train import TrainConfig, train_gate
from gatehead.tiny import build_tiny


def main() -> None:
    import peft
    import transformers

    out = {"torch": torch.__version__, "cuda": torch.cuda.get_device_name(0),
           "transformers": transformers.__version__, "peft": peft.__version__}
    t = build_tiny("/tmp/cudatiny")
    cpu = HFReference(t.model_dir, t.adapter_dir, "float32", "cpu")
    gpu = HFReference(t.model_dir, t.adapter_dir, "float32", "cuda")
    builder = PromptBuilder(cpu.tokenizer, "<|gate|>", PromptConfig(1024))
    gates = [builder.build(r.question, r.passages, r.conversation).gate for r in synthetic_requests(64, 3)]
    out["fp32_cpu_vs_cuda_max_dp"] = float(np.abs(cpu.gate_probs(gates) - gpu.gate_probs(gates)).max())
    bf16 = HFReference(t.model_dir, t.adapter_dir, "bfloat16", "cuda")
    out["bf16_cuda_vs_fp32_cpu_max_dp"] = float(np.abs(bf16.gate_probs(gates) - cpu.gate_probs(gates)).max())
    out["greedy_cuda_equals_cpu"] = gpu.generate([gates[0][:-1]], 16, True) == cpu.generate([gates[0][:-1]], 16, True)
    rng = random.Random(0)
    products = ["router", "battery", "laptop", "printer"]
    rows = []
    for i in range(90):
        product, label = rng.choice(products), ("answer", "search", "refuse")[i % 3]
        other = rng.choice([q for q in products if q != product])
        docs = {"answer": [f"The {product} warranty lasts 2 years."],
                "search": [f"The {other} warranty lasts 2 years."], "refuse": []}[label]
        rows.append(parse_example({"question": f"How long is the {product} warranty?", "documents": docs,
                                   "label": label}, f"row {i}"))
    start = time.time()
    result = train_gate(t.model_dir, rows[:60], rows[60:], "/tmp/cudatrained",
                        TrainConfig(epochs=4, device="cuda", progress=False, learning_rate=2e-3))
    out["train_cuda_seconds"] = round(time.time() - start, 1)
    out["train_val_loss"] = [round(e.val_loss, 4) for e in result.epochs]
    out["train_best_accuracy"] = result.epochs[result.best_epoch].val.accuracy
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
