"""Reading a request's keys and values back from vLLM's paged KV cache on CPU (suffix-mode gates).

A suffix-mode gate's branch attends to the base model's K/V of every prefix position, which vLLM's
CPU attention backend already holds in each layer's paged cache. That cache (vLLM 0.32,
`vllm/v1/attention/backends/cpu_attn.py`) is one tensor per layer, `[blocks, kv_heads, block_size,
2 * head_dim]`, viewed as `[blocks, kv_heads, 2 * block_size, head_dim]` and split in two along the
third axis: each (block, head) page holds `block_size * head_dim` key elements, then as many value
elements. Inside a page the order depends on the kernel family (`layer.isa`) that wrote it:

- `vec` (fp32 anywhere; bf16 without AMX): keys column-major (`[head_dim, block_size]`), values
  row-major (`[block_size, head_dim]`);
- `amx` (bf16 with AMX tiles): keys in 16-token groups of VNNI pairs of channels, values in 16-channel
  groups of VNNI pairs of tokens (see `decode_keys` / `decode_values`).

Other families (`vec16`, `neon`, fp8 caches, ...) are not read: `check_readable` refuses them. The
layouts come from vLLM's C++ sources, which the wheel ships compiled only; `self_test` writes random
keys and values with vLLM's own cache-writing op and checks that they read back exactly, so a wheel
whose layout differs is refused at start instead of giving wrong gates.
"""

from __future__ import annotations

import torch

READABLE_ISAS = ("vec", "amx")
_AMX_TOKENS = 16  # tokens per key group, channels per value group


def check_readable(isa: str, dtype: torch.dtype, cache_dtype: str, block_size: int, head_dim: int) -> None:
    """Raise ValueError, naming the fix, unless the branch can read this cache layout."""
    if cache_dtype != "auto":
        raise ValueError(f"suffix-mode gates read the KV cache in the model's dtype; kv_cache_dtype={cache_dtype!r} "
                         f"is not readable: leave kv_cache_dtype at 'auto', or use a prompt-mode gate")
    if isa not in READABLE_ISAS:
        raise ValueError(f"vLLM's CPU attention uses the {isa!r} KV layout here, which suffix-mode gates cannot read "
                         f"(readable: {list(READABLE_ISAS)}; a block size that is a multiple of 32 and a head_dim "
                         f"that is a multiple of 32 select them); use a prompt-mode gate on this configuration")
    if isa == "amx" and (block_size % (2 * _AMX_TOKENS) or head_dim % (2 * _AMX_TOKENS) or dtype != torch.bfloat16):
        raise ValueError(f"the amx KV layout is read for bf16 with block_size and head_dim multiples of 32, "
                         f"not dtype={dtype}, block_size={block_size}, head_dim={head_dim}")


def readable_layout(dtype: torch.dtype, cache_dtype: str, block_size: int, head_dim: int) -> str:
    """The KV layout (`isa`) vLLM's CPU attention picks for this configuration; ValueError, naming the fix,
    off CPU or when the branch cannot read it. The engine's client and its worker both ask."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    if not current_platform.is_cpu():
        raise ValueError(f"suffix-mode gates read vLLM's CPU paged KV layout, and this engine runs on "
                         f"{current_platform.device_name}, whose layout gatehead does not read yet: serve a "
                         f"prompt-mode gate adapter here instead")
    try:
        isa = _get_attn_isa(dtype, block_size, head_dim, cache_dtype)
    except NotImplementedError as refused:  # vLLM's own refusal on this CPU (FP8 KV without AVX-512, ...)
        raise ValueError(f"vLLM's CPU attention cannot run kv_cache_dtype={cache_dtype!r} here ({refused}); "
                         f"suffix-mode gates read the KV cache in the model's dtype: leave kv_cache_dtype at "
                         f"'auto'") from refused
    check_readable(isa, dtype, cache_dtype, block_size, head_dim)
    return isa


def key_value_pages(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value page views of one layer's cache, as the CPU backend makes them: [B, H, N, D] each."""
    blocks, heads, block_size, _ = kv_cache.shape
    return kv_cache.view(blocks, heads, 2 * block_size, -1).chunk(2, dim=2)


def decode_keys(pages: torch.Tensor, isa: str) -> torch.Tensor:
    """Pages [n, H, N, D] as written by the `isa` kernels -> keys [n, H, N, D] in token-major order."""
    n, heads, block_size, head_dim = pages.shape
    flat = pages.contiguous().view(n, heads, block_size * head_dim)
    if isa == "vec":  # element (t, c) at c * N + t
        return flat.view(n, heads, head_dim, block_size).transpose(2, 3)
    if isa == "amx":  # element (t, c) at (t // 16) * 16 * D + (c // 2) * 32 + (t % 16) * 2 + c % 2
        grouped = flat.view(n, heads, block_size // _AMX_TOKENS, head_dim // 2, _AMX_TOKENS, 2)
        return grouped.permute(0, 1, 2, 4, 3, 5).reshape(n, heads, block_size, head_dim)
    raise ValueError(f"unreadable KV layout {isa!r}")


def decode_values(pages: torch.Tensor, isa: str) -> torch.Tensor:
    """Pages [n, H, N, D] as written by the `isa` kernels -> values [n, H, N, D] in token-major order."""
    n, heads, block_size, head_dim = pages.shape
    if isa == "vec":  # row-major: element (t, c) at t * D + c
        return pages
    if isa == "amx":  # element (t, c) at (c // 16) * N * 16 + (t // 2) * 32 + (c % 16) * 2 + t % 2
        flat = pages.contiguous().view(n, heads, block_size * head_dim)
        grouped = flat.view(n, heads, head_dim // _AMX_TOKENS, block_size // 2, _AMX_TOKENS, 2)
        return grouped.permute(0, 1, 3, 5, 2, 4).reshape(n, heads, block_size, head_dim)
    raise ValueError(f"unreadable KV layout {isa!r}")


def gather(kv_cache: torch.Tensor, isa: str, block_ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `length` positions' keys and values of a request, from its block ids: [length, H, D] each."""
    block_size = kv_cache.shape[2]
    needed = -(-length // block_size)
    if needed > block_ids.numel():
        raise ValueError(f"{length} positions need {needed} blocks, the block table has {block_ids.numel()}")
    key_pages, value_pages = key_value_pages(kv_cache)
    ids = block_ids[:needed].to(device=kv_cache.device, dtype=torch.long)
    keys = decode_keys(key_pages[ids], isa)  # [needed, H, N, D]
    values = decode_values(value_pages[ids], isa)
    heads, head_dim = keys.shape[1], keys.shape[3]

    def positions(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(needed * block_size, heads, head_dim)[:length]

    return positions(keys), positions(values)


def self_test(isa: str, dtype: torch.dtype, num_kv_heads: int, block_size: int, head_dim: int,
              device: str | torch.device = "cpu") -> None:
    """Write random K/V with vLLM's own op into a scratch cache and check `gather` reads them back exactly."""
    from vllm import _custom_ops as ops

    generator = torch.Generator().manual_seed(0)
    tokens = 2 * block_size + block_size // 2  # three blocks, the last one partly filled
    key = torch.randn(tokens, num_kv_heads, head_dim, generator=generator).to(dtype=dtype, device=device)
    value = torch.randn(tokens, num_kv_heads, head_dim, generator=generator).to(dtype=dtype, device=device)
    cache = torch.zeros(5, num_kv_heads, block_size, 2 * head_dim, dtype=dtype, device=device)
    block_ids = torch.tensor([3, 0, 4])  # out of order, as a block table may be
    slots = (block_ids.repeat_interleave(block_size) * block_size + torch.arange(block_size).repeat(3))[:tokens]
    key_pages, value_pages = key_value_pages(cache)
    ops.cpu_attn_reshape_and_cache(key, value, key_pages, value_pages, slots.to(device), isa)
    read_key, read_value = gather(cache, isa, block_ids, tokens)
    if not (torch.equal(read_key, key) and torch.equal(read_value, value)):
        raise RuntimeError(f"this vLLM build's {isa!r} KV cache layout is not the one gatehead reads "
                           f"(gatehead.runtime.paged_kv): suffix-mode gates would read wrong keys and values. "
                           f"Use vLLM 0.32.x as pinned, or a prompt-mode gate")
