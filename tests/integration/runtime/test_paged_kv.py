"""Reading keys and values back from vLLM's CPU paged KV cache, written by vLLM's own op."""

from __future__ import annotations

import pytest
import torch

from gatehead.runtime.paged_kv import check_readable, gather, key_value_pages, self_test

LAYOUTS = [("vec", torch.float32), ("vec", torch.bfloat16), ("amx", torch.bfloat16)]


def amx() -> bool:
    return torch.cpu._is_amx_tile_supported()  # False where GATEHEAD_TEST_CPU_ISA emulates a CPU without AMX


@pytest.mark.parametrize(("isa", "dtype"), LAYOUTS)
@pytest.mark.parametrize(("heads", "block_size", "head_dim"), [(2, 32, 32), (4, 128, 64)])
def test_what_vllm_writes_reads_back_exactly(isa, dtype, heads, block_size, head_dim) -> None:
    if isa == "amx" and not amx():
        pytest.skip("this CPU has no AMX tiles: vLLM never writes the amx layout here")
    self_test(isa, dtype, heads, block_size, head_dim)


def test_reading_with_the_wrong_layout_is_caught() -> None:
    """The decode matters: keys written by the vec kernels do not read back as amx keys, and vice versa."""
    from vllm import _custom_ops as ops

    isas = ("vec", "amx") if amx() else ("vec",)
    for written in isas:
        cache = torch.zeros(2, 2, 32, 64, dtype=torch.bfloat16)
        key, value = torch.randn(40, 2, 32).bfloat16(), torch.randn(40, 2, 32).bfloat16()
        pages = key_value_pages(cache)
        ops.cpu_attn_reshape_and_cache(key, value, *pages, torch.arange(40), written)
        read = "amx" if written == "vec" else "vec"
        wrong_key, wrong_value = gather(cache, read, torch.tensor([0, 1]), 40)
        assert not torch.equal(wrong_key, key) and not torch.equal(wrong_value, value)
        right_key, right_value = gather(cache, written, torch.tensor([0, 1]), 40)
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
