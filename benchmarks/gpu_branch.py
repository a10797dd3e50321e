"""GPU section of the benchmarks: what the gate costs at a realistic scale, in PyTorch alone.

A Qwen3 configuration shaped like a 27B model (64 layers, hidden 5120, 64 query / 8 KV heads,
intermediate 19456: 26.7 B parameters) with random bf16 weights on one GPU. Measured:
- a dedicated gate: the full forward of a gate prompt through all 64 layers (+ norm + 3-way head);
- gatehead's marginal gate cost once the shared prefix is computed: the branch's k=4 layers over the
  prompt's tapped rows, with LoRA (r=8) on q/k/v/o/gate/up/down applied unmerged, the last layer on
  the last row only, then norm and head (the `GateBranch` arithmetic);
- the weights memory of one copy (the shared engine: base + LoRA + head) and of two (generation +
  dedicated gate: the base again without its LM head, plus the head), from the tensors' bytes.
Run by hand on a CUDA machine with torch and transformers (no vLLM): `python benchmarks/gpu_branch.py`.
Prints one JSON object. Absolute times are this GPU's; the ratios are the point.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.nn.functional as F

SHAPE = dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
             intermediate_size=19456, vocab_size=151936, max_position_embeddings=16384)
K, RANK = 4, 8
LENGTHS = (512, 2048, 8192)


def build(config, device):
    from transformers import Qwen3ForCausalLM

    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)  # random weights (HF's initialisation, std 0.02)
    finally:
        torch.set_default_dtype(torch.float32)
    return model.eval()


def timed(fn, repeats: int = 5) -> float:
    for _ in range(2):
        fn()
    if not torch.cuda.is_available():  # --smoke on a CPU: wall time
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(1000 * (time.perf_counter() - t))
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]  # median, ms


def lora(hidden: int, outs: dict[str, int], device) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (torch.randn(RANK, hidden if name not in ("o", "down") else size_in, device=device,
                               dtype=torch.bfloat16) * 0.02,
                   torch.randn(out, RANK, device=device, dtype=torch.bfloat16) * 0.02)
            for name, (out, size_in) in outs.items()}


@torch.inference_mode()
def branch(model, rows: torch.Tensor, adapters, head: torch.Tensor) -> torch.Tensor:
    """The gate branch on one prompt's tapped rows [L, hidden]: k layers with unmerged LoRA, norm, head."""
    layers = model.model.layers[-K:]
    n = rows.shape[0]
    positions = torch.arange(n, device=rows.device)[None]
    cos, sin = model.model.rotary_emb(rows[None], positions)
    h = rows
    for i, layer in enumerate(layers):
        last = i == K - 1
        a = adapters[i]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x) + (x @ a["q"][0].T) @ a["q"][1].T * 2
        k = attn.k_proj(x) + (x @ a["k"][0].T) @ a["k"][1].T * 2
        v = attn.v_proj(x) + (x @ a["v"][0].T) @ a["v"][1].T * 2
        q = attn.q_norm(q.view(n, -1, attn.head_dim)).transpose(0, 1)
        k = attn.k_norm(k.view(n, -1, attn.head_dim)).transpose(0, 1)
        v = v.view(n, -1, attn.head_dim).transpose(0, 1)
        c, s = cos[0][None], sin[0][None]
        q = q * c + _rotate(q) * s
        k = k * c + _rotate(k) * s
        if last:
            q = q[:, -1:]
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=not last, enable_gqa=True)[0]
        o = o.transpose(0, 1).reshape(q.shape[1], -1)
        o = attn.o_proj(o) + (o @ a["o"][0].T) @ a["o"][1].T * 2
        h = (h[-1:] if last else h) + o
        x = layer.post_attention_layernorm(h)
        mlp = layer.mlp
        g = mlp.gate_proj(x) + (x @ a["gate"][0].T) @ a["gate"][1].T * 2
        u = mlp.up_proj(x) + (x @ a["up"][0].T) @ a["up"][1].T * 2
        m = F.silu(g) * u
        h = h + mlp.down_proj(m) + (m @ a["down"][0].T) @ a["down"][1].T * 2
    return model.model.norm(h[-1:]).float() @ head.T


def _rotate(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.inference_mode()
def dedicated(model, ids: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """A dedicated gate engine's work: every layer over the prompt, then the head on the last row."""
    hidden = model.model(input_ids=ids).last_hidden_state
    return hidden[0, -1:].float() @ head.T


def main() -> None:
    global SHAPE, LENGTHS
    from transformers import Qwen3Config

    if "--smoke" in sys.argv:  # a tiny shape, to check the script anywhere (CPU included)
        SHAPE = dict(SHAPE, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, intermediate_size=512, vocab_size=1024)
        LENGTHS = (64,)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.time()
    config = Qwen3Config(**SHAPE)
    model = build(config, device)
    params = sum(p.numel() for p in model.parameters())
    one_copy = sum(p.numel() * p.element_size() for p in model.parameters())
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    hidden, inter = SHAPE["hidden_size"], SHAPE["intermediate_size"]
    q_out = SHAPE["num_attention_heads"] * SHAPE["head_dim"]
    kv_out = SHAPE["num_key_value_heads"] * SHAPE["head_dim"]
    adapters = [lora(hidden, {"q": (q_out, hidden), "k": (kv_out, hidden), "v": (kv_out, hidden),
                              "o": (hidden, q_out), "gate": (inter, hidden), "up": (inter, hidden),
                              "down": (hidden, inter)}, device) for _ in range(K)]
    head = torch.randn(3, hidden, device=device) * 0.02
    lora_bytes = sum(t.numel() * t.element_size() for a in adapters for pair in a.values() for t in pair) \
        + head.numel() * head.element_size()
    # The dedicated gate's weights: every layer and the embeddings again (no LM head), plus the 3-way head.
    dedicated_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "lm_head" not in n)
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "none (smoke run)"
    out = {"gpu": gpu, "torch": torch.__version__, "shape": SHAPE, "k": K,
           "lora_rank": RANK, "parameters_billion": round(params / 1e9, 2),
           "weights_gib": {"one_shared_engine": round((one_copy + lora_bytes) / 2**30, 2),
                           "two_engines": round((one_copy + dedicated_bytes) / 2**30, 2)},
           "timings_ms": []}
    if "--smoke" in sys.argv:  # the branch's arithmetic is the model's: zero LoRA, true tapped rows
        ids = torch.randint(0, SHAPE["vocab_size"], (1, 32), device=device)
        with torch.inference_mode():
            tapped = model.model(input_ids=ids, output_hidden_states=True).hidden_states[-K - 1][0]
        zero = [{n: (a * 0, b) for n, (a, b) in layer.items()} for layer in adapters]
        out["smoke_branch_vs_full_forward_max_abs"] = float(
            (branch(model, tapped, zero, head) - dedicated(model, ids, head)).abs().max())
    for length in LENGTHS:
        ids = torch.randint(0, SHAPE["vocab_size"], (1, length), device=device)
        rows = model.model.embed_tokens(ids)[0].contiguous()  # stands in for the tapped residual rows
        full = timed(lambda ids=ids: dedicated(model, ids, head))
        gate = timed(lambda rows=rows: branch(model, rows, adapters, head))
        out["timings_ms"].append({"prompt_tokens": length, "dedicated_full_forward": round(full, 3),
                                  "shared_branch_marginal": round(gate, 3), "ratio": round(gate / full, 4)})
        print(json.dumps(out["timings_ms"][-1]), file=sys.stderr, flush=True)
    if device == "cuda":
        out["peak_gib_during_timings"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["allocated_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    out["seconds"] = round(time.time() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
