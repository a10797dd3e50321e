"""The gate branch: the last k layers of the base, their unmerged LoRA, the final norm and the 3-way head.

The branch calls the base layers' own modules (`qkv_proj`, norms, rotary, `o_proj`, MLP), so it reuses
their weight tensors by reference: no second copy of k layers. LoRA is applied unmerged,
`x W + (x A) B * scaling`. The last layer computes only the last token's row, the one the head
reads. The head runs in fp32, as vLLM's pooling classifier does.

Attention, prompt mode: KV-free, causal SDPA over one gate request's own rows, which is why the
branch needs every tapped row of the prompt. Suffix mode (an activated gate, LoRA on the suffix
rows only): the rows are the suffix's, at their absolute positions, and in each layer their queries
attend to the base model's keys and values of every earlier position, read from that layer's paged
KV cache (`gatehead.runtime.paged_kv`) through the request's block ids, then to the suffix's own
LoRA keys and values, causally. The prefix rows would have had no LoRA, so their cached K/V are
exactly what the gate model computes for them.

Precision: the branch computes what the engine's own layers would. The projections and norms are
the base modules. The LoRA delta is computed in fp32 and added before the one rounding to the
dtype, the nearest the unmerged form gets to a LoRA merged in fp32. Attention is torch's SDPA at the
precision of the engine's attention backend: vLLM's CPU "vec" kernels (CPUs without AMX) keep the
probabilities in fp32, so the branch attends in fp32 there; AMX tiles and GPU kernels multiply V by
probabilities in the model's dtype, and so does the branch. (Measured on the tiny test model: the
matching precision brings the gate closer to the dedicated engine's on each kind of CPU, the other
one moves it away.)

It runs eagerly, outside vLLM's compiled graph, on gate requests only.

Tensor parallelism: the base modules are already sharded, so each rank's branch holds the LoRA
slices that match them. Column-parallel projections (q/k/v, gate/up) take the rows of B for the
rank's output slice (K/V follow vLLM's head replication when there are fewer KV heads than ranks);
row-parallel ones (o, down) take the columns of A for the rank's input slice, and the small
[tokens, r] product is all-reduced before B, as the base all-reduces its own output. Every rank
then holds the same residual stream, and the head runs on it unsharded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

from gatehead.gate.adapter import ADAPTER_WEIGHTS, GateAdapter
from gatehead.runtime import paged_kv

_LORA_KEY = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def _tensor_parallel() -> tuple[int, int]:
    """(size, rank) of the tensor-parallel group; (1, 0) outside an initialised vLLM worker."""
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 1, 0
    return parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank()


@dataclass(frozen=True)
class Prefix:
    """Where a suffix-mode gate's prefix lies: its `length` positions' K/V in the KV blocks `blocks`."""

    length: int
    blocks: tuple[int, ...]


class GateBranch(nn.Module):
    """Runs the gate model's last k layers and head on one request's tapped rows."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module, adapter: GateAdapter,
                 device: torch.device, attention_fp32: bool = False, prefix_keys: bool = True) -> None:
        super().__init__()
        self.attention_fp32 = attention_fp32
        # False only in the negative control of suffix mode: the suffix attends to itself alone.
        self.prefix_keys = prefix_keys
        # Plain lists: the base modules must not be registered twice (their weights belong to the base).
        self.layers = list(layers)
        self.final_norm = [final_norm]
        self.first_layer = adapter.branch_layer
        self.scaling = adapter.scaling
        self.lora_names: dict[tuple[int, str], tuple[str, str]] = {}
        self.tp_size, self.tp_rank = _tensor_parallel()
        self._cos_sin_fp32: dict[int, torch.Tensor] = {}  # see `_rotary`
        weights = load_file(Path(adapter.path) / ADAPTER_WEIGHTS, device=str(device))
        for key, tensor in weights.items():
            match = _LORA_KEY.search(key)
            if match is None:
                continue
            layer, module, ab = int(match.group(1)), match.group(2), match.group(3)
            name = f"lora_{layer}_{module}_{ab}"
            attn = self.layers[layer - self.first_layer].self_attn
            self.register_buffer(name, self._shard(module, ab, tensor, attn).float().contiguous(), persistent=False)
            a_name, b_name = self.lora_names.get((layer, module), ("", ""))
            self.lora_names[(layer, module)] = (name, b_name) if ab == "A" else (a_name, name)
        head = next(t for k, t in weights.items() if k.endswith("score.weight"))
        self.register_buffer("head", head.float(), persistent=False)  # [3, hidden], fp32

    def _shard(self, module: str, ab: str, tensor: torch.Tensor, attn: nn.Module) -> torch.Tensor:
        """This rank's slice of a LoRA matrix (A: [r, in], B: [out, r]), matching the base module's shard."""
        if self.tp_size == 1:
            return tensor
        if module in ("o_proj", "down_proj"):  # row-parallel: the input is split
            return tensor.chunk(self.tp_size, dim=1)[self.tp_rank] if ab == "A" else tensor
        if ab == "A":  # column-parallel: A sees the whole input
            return tensor
        if module in ("k_proj", "v_proj"):  # KV heads: split, or replicated when fewer than ranks
            replicas = max(1, self.tp_size // (tensor.shape[0] // attn.head_dim))
            return tensor.chunk(self.tp_size // replicas, dim=0)[self.tp_rank // replicas]
        return tensor.chunk(self.tp_size, dim=0)[self.tp_rank]

    def _lora(self, layer: int, module: str, x: torch.Tensor, reduce: bool = False) -> torch.Tensor | None:
        """The LoRA delta [L, out] of `module` on `x`, in fp32 (None if the module has no LoRA)."""
        names = self.lora_names.get((layer, module))
        if names is None:
            return None
        a, b = getattr(self, names[0]), getattr(self, names[1])  # fp32
        xa = x.float() @ a.T  # [L, r]; a partial sum over this rank's input slice when `reduce`
        if reduce and self.tp_size > 1:
            from vllm.distributed import tensor_model_parallel_all_reduce

            xa = tensor_model_parallel_all_reduce(xa)
        return xa @ b.T * self.scaling

    def _add_lora(self, layer: int, modules: tuple[str, ...], x: torch.Tensor, out: torch.Tensor,
                  sizes: list[int]) -> torch.Tensor:
        """`out` (a fused projection's output, split by `sizes`) plus each module's LoRA delta."""
        deltas = [self._lora(layer, m, x) for m in modules]
        if all(d is None for d in deltas):
            return out
        parts = list(out.split(sizes, dim=-1))
        return torch.cat([p if d is None else (p.float() + d).to(p.dtype) for p, d in zip(parts, deltas, strict=True)],
                         dim=-1)

    @torch.inference_mode()
    def forward(self, rows: torch.Tensor, prefix: Prefix | None = None) -> torch.Tensor:
        """Head logits [3] (fp32) for one gate prompt whose tapped rows are `rows` [2, L, hidden]: the
        (hidden, residual) inputs of layer N-k's norm, of every prompt token, or with `prefix` (suffix
        mode) of the suffix's tokens, which follow the `prefix.length` positions in the KV cache."""
        n = rows.shape[1]
        start = prefix.length if prefix is not None else 0
        positions = torch.arange(start, start + n, device=rows.device)
        hidden, residual = rows[0], rows[1]
        for offset, layer in enumerate(self.layers):
            index = self.first_layer + offset
            last = offset == len(self.layers) - 1
            norm = layer.input_layernorm
            h, residual = (norm.untapped if offset == 0 else norm)(hidden, residual)
            attn_out = self._attention(index, layer.self_attn, h, positions, last, prefix)
            if last:  # only the last token's row reaches the head
                residual = residual[-1:]
            h, residual = layer.post_attention_layernorm(attn_out, residual)
            hidden = self._mlp(index, layer.mlp, h)
        normed, _ = self.final_norm[0](hidden, residual)
        return normed[-1].float() @ self.head.T

    def _attention(self, index: int, attn: nn.Module, h: torch.Tensor, positions: torch.Tensor,
                   last_only: bool, prefix: Prefix | None) -> torch.Tensor:
        n, head_dim = h.shape[0], attn.head_dim
        qkv, _ = attn.qkv_proj(h)
        qkv = self._add_lora(index, QKV, h, qkv, [attn.q_size, attn.kv_size, attn.kv_size])
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        if hasattr(attn, "q_norm"):  # Qwen3's per-head norms
            q = attn.q_norm(q.reshape(n, -1, head_dim)).reshape(n, -1)
            k = attn.k_norm(k.reshape(n, -1, head_dim)).reshape(n, -1)
        q, k = self._rotary(attn.rotary_emb, positions, q, k)
        if last_only:
            q = q[-1:]
        q = q.reshape(q.shape[0], attn.num_heads, head_dim).transpose(0, 1)  # [H, Lq, D]
        k = k.reshape(n, attn.num_kv_heads, head_dim)  # [L, Hkv, D]
        v = v.reshape(n, attn.num_kv_heads, head_dim)
        mask = None  # causal over the request's own rows; the last-only query attends every key
        if prefix is not None and self.prefix_keys and prefix.length:
            # The base's K/V of positions [0, length), rotated as vLLM wrote them: [length, Hkv, D].
            cache = attn.attn.kv_cache
            blocks = torch.tensor(prefix.blocks, dtype=torch.long)
            cached_k, cached_v = paged_kv.gather(cache, attn.attn.isa, blocks, prefix.length)
            k, v = torch.cat([cached_k, k]), torch.cat([cached_v, v])
            if not last_only:  # suffix query i sees every prefix key and suffix keys 0..i
                mask = torch.ones(n, prefix.length + n, dtype=torch.bool, device=h.device)
                mask[:, prefix.length:] = torch.ones(n, n, dtype=torch.bool, device=h.device).tril()
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # [Hkv, keys, D]
        if self.attention_fp32:
            q, k, v = q.float(), k.float(), v.float()
        # enable_gqa shares each K/V head across its query heads without copying them.
        causal = mask is None and not last_only
        out = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask,
                                             is_causal=causal, scale=attn.scaling, enable_gqa=True)
        out = out[0].transpose(0, 1).reshape(q.shape[1], attn.q_size).to(h.dtype)  # [Lq, H*D]
        o, _ = attn.o_proj(out)
        delta = self._lora(index, "o_proj", out, reduce=True)
        return o if delta is None else (o.float() + delta).to(o.dtype)

    def _rotary(self, rotary: nn.Module, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`rotary(positions, q, k)`, computed in fp32 and rounded once to the dtype on CPUs.

        vLLM's CPU rotary kernel for CPUs without AVX-512 BF16 (its `_C_AVX512` build) rounds its fp32
        result to bf16 toward zero, not to nearest, which biases every rotated value (measured: all of
        them match truncation there, and round-to-nearest on `_C`). Called on fp32 tensors the same
        kernel rounds nothing, and `.to(dtype)` rounds to nearest, as `_C`'s bf16 kernel does: the
        same values where the CPU has bf16, the correctly rounded ones where it has not.
        """
        from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

        plain = type(rotary).forward_cpu is RotaryEmbedding.forward_cpu
        if q.device.type != "cpu" or q.dtype == torch.float32 or not plain:
            return rotary(positions, q, k)
        from vllm import _custom_ops as ops

        cache = self._cos_sin_fp32.get(id(rotary))
        if cache is None:  # the model's cos/sin values (already rounded to its dtype), held in fp32
            cache = self._cos_sin_fp32[id(rotary)] = rotary.cos_sin_cache.float()
        q32, k32 = q.float(), k.float()
        ops.rotary_embedding(positions, q32, k32, rotary.head_size, cache, rotary.is_neox_style)
        return q32.to(q.dtype), k32.to(k.dtype)

    def _mlp(self, index: int, mlp: nn.Module, h: torch.Tensor) -> torch.Tensor:
        gate_up, _ = mlp.gate_up_proj(h)
        half = gate_up.shape[-1] // 2
        gate_up = self._add_lora(index, GATE_UP, h, gate_up, [half, half])
        x = mlp.act_fn(gate_up)
        down, _ = mlp.down_proj(x)
        delta = self._lora(index, "down_proj", x, reduce=True)
        return down if delta is None else (down.float() + delta).to(down.dtype)

    def memory_bytes(self) -> int:
        """Bytes of the tensors the branch owns (LoRA and head; the layers are the base's)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())
