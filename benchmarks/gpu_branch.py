"""GPU section of the benchmarks: what the gate costs at a realistic scale, in PyTorch alone.

A Qwen3 configuration shaped like a 27B model (64 layers, hidden 5120, 64 query / 8 KV heads,
intermediate 19456: 26.7 B parameters) with random bf16 weights on one GPU. Measured:
- a dedicated gate: the full forward of a gate prompt through all 64 layers (+ norm + 3-way head);
- gatehead's marginal gate cost once the shared prefix is computed: the branch's k=4 layers over the
  prompt's tapped rows, with LoRA (r=8) on q/k/v/o/gate/up/down applied unmerged, the last layer on
  the last row only, then norm and head (the `GateBranch` arithmetic);
- the weights memory of one copy (the shared engine: base + LoRA + head) and of two (generation +
  dedicated gate: the base again without its LM head, plus the head), from the tensors' bytes;
- a suffix-mode (activated) gate after a cached prefix of 2k and 8k tokens: the branch over the 4 suffix
  rows, each layer's queries attending to the prefix's K/V read from a paged cache (16-token blocks in
  shuffled order, gathered through a block table) and to the suffix's own, against the dedicated gate's
  full forward of the same prompt and against a dedicated gate with prefix caching (the 4 rows through
  all 64 layers over the cached prefix); eagerly, and replayed as one CUDA graph (what a GPU serving
  engine's graphs would do: gatehead's suffix mode runs on CPU only today, so this is the arithmetic's
  cost, not a measured gatehead path);
- the batched prompt-mode branch: 8 gate prompts of 512 to 2,048 tokens, and 8 of 64 to 256, in one
  pass (rows packed, attention once per prompt length, unpadded, as `GateBranch.forward_batch`)
  against 8 sequential passes.
`--smoke` (any machine, a tiny shape) checks the arithmetic: with zero LoRA the branch, the suffix branch
on the cached K/V and the batched branch all give the full forward's head logits.
Run by hand on a CUDA machine with torch and transformers (no vLLM): `python benchmarks/gpu_branch.py`.
Prints one JSON object. Absolute times are this GPU's; the ratios are the point. Each time is the median
of 5 timed repeats; `--combine A.json B.json C.json` merges separate runs into one object whose every
number is {median, min, max} over the runs (a value every run gave alike stays a number).
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
SUFFIX, BLOCK = 4, 16  # suffix rows of an activated gate; paged-cache block size
PREFIXES = (2048, 8192)
BATCH_LENGTHS = {"long": (512, 768, 1024, 1280, 1536, 1792, 2048, 1024),  # the batched prompt-mode passes
                 "short": (64, 96, 128, 160, 192, 224, 256, 128)}


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
    return batched_branch(model, [rows], adapters, head)


def _lora(x: torch.Tensor, pair) -> torch.Tensor:
    return (x @ pair[0].T) @ pair[1].T * 2


def _attention(layer, a, h: torch.Tensor, cos, sin, attend) -> torch.Tensor:
    """One branch layer on rows h [T, hidden]; `attend(q, k, v)` [H|Hkv, T, D] -> [H, Tq, D]."""
    attn, n = layer.self_attn, h.shape[0]
    x = layer.input_layernorm(h)
    q = attn.q_proj(x) + _lora(x, a["q"])
    k = attn.k_proj(x) + _lora(x, a["k"])
    v = attn.v_proj(x) + _lora(x, a["v"])
    q = attn.q_norm(q.view(n, -1, attn.head_dim)).transpose(0, 1)
    k = attn.k_norm(k.view(n, -1, attn.head_dim)).transpose(0, 1)
    v = v.view(n, -1, attn.head_dim).transpose(0, 1)
    q, k = q * cos + _rotate(q) * sin, k * cos + _rotate(k) * sin
    o = attend(q, k, v)
    o = o.transpose(0, 1).reshape(o.shape[1], -1)
    return attn.o_proj(o) + _lora(o, a["o"])


def _finish(layer, a, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    h = h + o
    x = layer.post_attention_layernorm(h)
    mlp = layer.mlp
    m = F.silu(mlp.gate_proj(x) + _lora(x, a["gate"])) * (mlp.up_proj(x) + _lora(x, a["up"]))
    return h + mlp.down_proj(m) + _lora(m, a["down"])


@torch.inference_mode()
def batched_branch(model, prompts: list[torch.Tensor], adapters, head: torch.Tensor) -> torch.Tensor:
    """The branch on B prompts' tapped rows in one pass, as gatehead's runtime runs it: rows packed
    [T, hidden] for the projections and MLP, attention once per prompt length, unpadded (padding to the
    longest would round each prompt's attention differently from a pass of its own)."""
    layers = model.model.layers[-K:]
    lengths = [p.shape[0] for p in prompts]
    device = prompts[0].device
    offsets = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    slot = torch.cat([torch.arange(n, device=device) for n in lengths])
    last = torch.tensor(offsets[1:], device=device) - 1
    shapes: dict[int, list[int]] = {}
    for b, n in enumerate(lengths):
        shapes.setdefault(n, []).append(b)
    # Each shape's rows in the packed stream, [b, n], and their requests' last rows.
    rows = {n: torch.stack([torch.arange(offsets[b], offsets[b] + n, device=device) for b in bs])
            for n, bs in shapes.items()}
    cos, sin = model.model.rotary_emb(prompts[0][None], slot[None])
    cos, sin = cos[0][None], sin[0][None]  # [1, T, D]
    h = torch.cat(prompts)
    for i, layer in enumerate(layers):
        final = i == K - 1

        def attend(q, k, v, final=final):  # [heads, T, D]
            out = q.new_empty(q.shape[0], len(prompts) if final else q.shape[1], q.shape[2])
            for n, bs in shapes.items():
                index = rows[n]  # [b, n]
                keys_, values = k[:, index].transpose(0, 1), v[:, index].transpose(0, 1)  # [b, Hkv, n, D]
                if final:  # the last row of each prompt only
                    queries = q[:, index[:, -1:]].transpose(0, 1)  # [b, H, 1, D]
                    o = F.scaled_dot_product_attention(queries, keys_, values, enable_gqa=True)
                    out[:, bs] = o[:, :, 0].transpose(0, 1)
                else:
                    o = F.scaled_dot_product_attention(q[:, index].transpose(0, 1), keys_, values, is_causal=True,
                                                       enable_gqa=True)  # [b, H, n, D]
                    out[:, index.reshape(-1)] = o.transpose(0, 1).reshape(o.shape[1], -1, o.shape[3])
            return out

        o = _attention(layer, adapters[i], h, cos, sin, attend)
        h = _finish(layer, adapters[i], h[last] if final else h, o)
    return model.model.norm(h).float() @ head.T  # [B, 3]


@torch.inference_mode()
def suffix_branch(model, rows: torch.Tensor, start: int, caches, table: torch.Tensor, adapters,
                  head: torch.Tensor) -> torch.Tensor:
    """A suffix-mode gate: the suffix's tapped rows [S, hidden] at positions start.., each layer attending to
    the prefix's K/V in that layer's paged cache ([blocks, BLOCK, Hkv, D] each, read through `table`) and,
    causally, to the suffix's own."""
    layers = model.model.layers[-K:]
    n = rows.shape[0]
    positions = torch.arange(start, start + n, device=rows.device)[None]
    cos, sin = model.model.rotary_emb(rows[None], positions)
    cos, sin = cos[0][None], sin[0][None]
    mask = torch.ones(n, start + n, dtype=torch.bool, device=rows.device)
    mask[:, start:] = torch.ones(n, n, dtype=torch.bool, device=rows.device).tril()
    h = rows
    for i, layer in enumerate(layers):
        final = i == K - 1
        key_cache, value_cache = caches[i]

        def attend(q, k, v, key_cache=key_cache, value_cache=value_cache, final=final):
            cached_k = key_cache[table].flatten(0, 1)[:start].transpose(0, 1)  # [Hkv, P, D]
            cached_v = value_cache[table].flatten(0, 1)[:start].transpose(0, 1)
            keys, values = torch.cat([cached_k, k], dim=1), torch.cat([cached_v, v], dim=1)
            if final:
                return F.scaled_dot_product_attention(q[None, :, -1:], keys[None], values[None], enable_gqa=True)[0]
            return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask,
                                                  enable_gqa=True)[0]

        o = _attention(layer, adapters[i], h, cos, sin, attend)
        h = _finish(layer, adapters[i], h[-1:] if final else h, o)
    return model.model.norm(h).float() @ head.T


def captured(fn) -> torch.cuda.CUDAGraph:
    """`fn` captured as a CUDA graph (after warm-up runs on a side stream, as PyTorch requires)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def paged(keys: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys or values [P, Hkv, D] laid out in a paged cache of BLOCK-token blocks in shuffled order:
    (cache [blocks + 1, BLOCK, Hkv, D], block table). Block 0 stays unused, as a free block would."""
    blocks = -(-keys.shape[0] // BLOCK)
    padded = torch.zeros(blocks * BLOCK, *keys.shape[1:], dtype=keys.dtype, device=keys.device)
    padded[:keys.shape[0]] = keys
    table = (torch.randperm(blocks, generator=generator) + 1).to(keys.device)
    cache = torch.zeros(blocks + 1, BLOCK, *keys.shape[1:], dtype=keys.dtype, device=keys.device)
    cache[table] = padded.view(blocks, BLOCK, *keys.shape[1:])
    return cache, table


@torch.inference_mode()
def prefix_caches(model, ids: torch.Tensor, generator: torch.Generator):
    """The last K layers' K/V of `ids` [1, P] (rotated, as a KV cache holds them) in paged caches, and the
    block table; the tapped rows of layer N-K for every position."""
    out = model.model(input_ids=ids, use_cache=True, output_hidden_states=True)
    cache = out.past_key_values
    layers = len(model.model.layers)
    caches, table = [], None
    for index in range(layers - K, layers):
        if hasattr(cache, "layers"):
            k, v = cache.layers[index].keys, cache.layers[index].values
        else:
            k, v = cache.key_cache[index], cache.value_cache[index]
        state = torch.Generator().manual_seed(generator.initial_seed())  # one block table for every layer
        key_cache, table = paged(k[0].transpose(0, 1), state)
        value_cache, _ = paged(v[0].transpose(0, 1), torch.Generator().manual_seed(generator.initial_seed()))
        caches.append((key_cache, value_cache))
    return caches, table, out.hidden_states[-K - 1][0]


def _rotate(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.inference_mode()
def dedicated(model, ids: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    """A dedicated gate engine's work: every layer over the prompt, then the head on the last row."""
    hidden = model.model(input_ids=ids).last_hidden_state
    return hidden[0, -1:].float() @ head.T


def dedicated_after_prefix(model, ids: torch.Tensor, prefix: int, head: torch.Tensor) -> float:
    """Time (ms) of a dedicated gate engine with prefix caching on a prompt whose first `prefix` tokens are
    cached: the remaining tokens through every layer, attending to the cached K/V, then the head."""
    with torch.inference_mode():
        cache = model.model(input_ids=ids[:, :prefix], use_cache=True).past_key_values

        def step():
            hidden = model.model(input_ids=ids[:, prefix:], past_key_values=cache, use_cache=True).last_hidden_state
            cache.crop(prefix)  # the next call finds the prefix alone cached again
            return hidden[0, -1:].float() @ head.T

        return timed(step)


def smoke(model, zero, head: torch.Tensor, device) -> dict[str, float]:
    """With zero LoRA each branch form must give the full forward's head logits (within bf16)."""
    ids = torch.randint(0, SHAPE["vocab_size"], (1, 40), device=device)
    full = dedicated(model, ids, head)
    with torch.inference_mode():
        tapped = model.model(input_ids=ids, output_hidden_states=True).hidden_states[-K - 1][0]
        caches, table, _ = prefix_caches(model, ids[:, :-SUFFIX], torch.Generator().manual_seed(1))
        shorter = ids[:, :24]
        short_tapped = model.model(input_ids=shorter, output_hidden_states=True).hidden_states[-K - 1][0]
    both = batched_branch(model, [tapped, short_tapped], zero, head)
    return {"branch": float((branch(model, tapped, zero, head) - full).abs().max()),
            "suffix_branch": float((suffix_branch(model, tapped[-SUFFIX:], ids.shape[1] - SUFFIX, caches, table,
                                                  zero, head) - full).abs().max()),
            "batched_branch": max(float((both[0] - full[0]).abs().max()),
                                  float((both[1] - dedicated(model, shorter, head)[0]).abs().max()))}


def combine(runs: list) -> object:
    """Runs' objects (one structure) -> that structure with each number as {median, min, max}, except a value
    every run gave alike (the shape, the sizes, a timing that rounded the same three times), kept as it is."""
    first = runs[0]
    if isinstance(first, dict):
        return {k: combine([r[k] for r in runs]) for k in first}
    if isinstance(first, list):
        return [combine([r[i] for r in runs]) for i in range(len(first))]
    if isinstance(first, bool) or not isinstance(first, int | float) or all(r == first for r in runs):
        return first
    values = sorted(float(r) for r in runs)
    return {"median": values[len(values) // 2], "min": values[0], "max": values[-1]}


def prompt_mode_rows(model, adapters, head, device: str) -> list[dict]:
    """The prompt-mode branch over every tapped row against a dedicated gate's full forward, per length."""
    rows_out = []
    for length in LENGTHS:
        ids = torch.randint(0, SHAPE["vocab_size"], (1, length), device=device)
        rows = model.model.embed_tokens(ids)[0].contiguous()  # stands in for the tapped residual rows
        full = timed(lambda ids=ids: dedicated(model, ids, head))
        gate = timed(lambda rows=rows: branch(model, rows, adapters, head))
        rows_out.append({"prompt_tokens": length, "dedicated_full_forward": round(full, 3),
                         "shared_branch_marginal": round(gate, 3), "ratio": round(gate / full, 4)})
        print(json.dumps(rows_out[-1]), file=sys.stderr, flush=True)
    return rows_out


def suffix_mode_rows(model, adapters, head, device: str) -> list[dict]:
    """The suffix-mode branch reading a paged cache against a dedicated gate, full and prefix-cached."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for prefix in PREFIXES:
        ids = torch.randint(0, SHAPE["vocab_size"], (1, prefix + SUFFIX), device=device)
        rows = model.model.embed_tokens(ids)[0, prefix:].contiguous()
        kv = [torch.randn(prefix, SHAPE["num_key_value_heads"], SHAPE["head_dim"], device=device,
                          dtype=torch.bfloat16) for _ in range(2)]
        key_cache, table = paged(kv[0], generator)
        value_cache, _ = paged(kv[1], torch.Generator().manual_seed(generator.initial_seed()))
        caches = [(key_cache, value_cache)] * K  # the cost is each layer's; the values need not differ
        full = timed(lambda ids=ids: dedicated(model, ids, head))
        warm = dedicated_after_prefix(model, ids, prefix, head)
        gate = timed(lambda rows=rows, caches=caches, table=table, prefix=prefix:
                     suffix_branch(model, rows, prefix, caches, table, adapters, head))
        row = {"cached_prefix_tokens": prefix, "suffix_tokens": SUFFIX, "dedicated_full_forward": round(full, 3),
               "dedicated_prefix_cached": round(warm, 3), "suffix_branch": round(gate, 3),
               "ratio": round(gate / full, 5), "ratio_to_prefix_cached": round(gate / warm, 4)}
        if device == "cuda":  # the same branch replayed as one CUDA graph: no per-kernel launch cost
            graph = captured(lambda rows=rows, caches=caches, table=table, prefix=prefix:
                             suffix_branch(model, rows, prefix, caches, table, adapters, head))
            replay = timed(graph.replay)
            row.update(suffix_branch_cuda_graph=round(replay, 3), ratio_cuda_graph=round(replay / full, 5))
        out.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return out


def batched_rows(model, adapters, head, device: str) -> dict[str, dict]:
    """Gate prompts packed into one branch pass against one after another, and how far their logits differ."""
    out = {}
    for name, lengths in BATCH_LENGTHS.items():
        prompts = [model.model.embed_tokens(torch.randint(0, SHAPE["vocab_size"], (1, n), device=device))[0]
                   for n in lengths]
        sequential = timed(lambda prompts=prompts: [branch(model, rows, adapters, head) for rows in prompts])
        batched = timed(lambda prompts=prompts: batched_branch(model, prompts, adapters, head))
        agree = (batched_branch(model, prompts, adapters, head)
                 - torch.cat([branch(model, rows, adapters, head) for rows in prompts])).abs().max()
        out[name] = {"prompt_tokens": list(lengths), "sequential": round(sequential, 3), "batched": round(batched, 3),
                     "ratio": round(batched / sequential, 4), "max_abs_logit_batched_vs_sequential": float(agree)}
        print(json.dumps(out[name]), file=sys.stderr, flush=True)
    return out


def main() -> None:
    global SHAPE, LENGTHS, PREFIXES, BATCH_LENGTHS
    from transformers import Qwen3Config

    if "--combine" in sys.argv:
        runs = [json.loads(open(path).read()) for path in sys.argv[sys.argv.index("--combine") + 1:]]
        print(json.dumps({"runs": len(runs), **combine(runs)}, indent=2))
        return
    if "--smoke" in sys.argv:  # a tiny shape, to check the script anywhere (CPU included)
        SHAPE = dict(SHAPE, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=64, intermediate_size=512, vocab_size=1024)
        LENGTHS, PREFIXES, BATCH_LENGTHS = (64,), (48,), {"short": (16, 40, 24)}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and "--smoke" not in sys.argv:
        sys.exit("benchmarks/gpu_branch.py times a 27B-shaped model on a CUDA GPU, and this machine has none "
                 "(--smoke checks the script on a small shape, on any device)")
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
                           "two_engines": round((one_copy + dedicated_bytes) / 2**30, 2)}}
    if "--smoke" in sys.argv:  # the branch's arithmetic is the model's: zero LoRA, true tapped rows
        zero = [{n: (a * 0, b) for n, (a, b) in layer.items()} for layer in adapters]
        out["smoke_max_abs_vs_full_forward"] = smoke(model, zero, head, device)
    out["timings_ms"] = prompt_mode_rows(model, adapters, head, device)
    out["suffix_mode_ms"] = suffix_mode_rows(model, adapters, head, device)
    out["batched_prompt_mode_ms"] = batched_rows(model, adapters, head, device)
    if device == "cuda":
        out["peak_gib_during_timings"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        out["allocated_gib"] = round(torch.cuda.memory_allocated() / 2**30, 2)
    out["seconds"] = round(time.time() - started, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
