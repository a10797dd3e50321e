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
dtype, the nearest the unmerged form gets to a LoRA merged in fp32 (on CPU the delta's two matmuls run in
fp64, so that it does not depend on how many gate requests share the pass). On CPU the rotary embedding is
computed in fp32 and rounded once to nearest (`_rotary`: vLLM's kernel for CPUs without AVX-512 BF16
rounds toward zero). Attention is torch's SDPA at the
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
from safetensors import safe_open
from torch import nn
from torch.nn import functional as F

from gatehead.gate.adapter import ADAPTER_WEIGHTS, GateAdapter
from gatehead.runtime import paged_kv

_LORA_KEY = re.compile(r"\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def _rotary_in_fp32(rotary: nn.Module, device: torch.device) -> bool:
    """Whether the branch rotates through `GateBranch._rotary`'s fp32 path: vLLM's plain rotary on a CPU, in
    a dtype below fp32 (its own kernel then rounds toward zero where the CPU lacks AVX-512 BF16)."""
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    return (torch.device(device).type == "cpu" and rotary.cos_sin_cache.dtype != torch.float32
            and type(rotary).forward_cpu is RotaryEmbedding.forward_cpu)


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


Request = tuple[torch.Tensor, Prefix | None]  # a gate prompt's tapped rows [2, L, hidden], its prefix in suffix mode


@dataclass(frozen=True)
class Workspace:
    """How many gate requests one branch pass takes: a group's padded keys (requests x the longest one's keys)
    stay within `max_keys` and its packed rows within `max_rows`, so the group's largest tensors are no
    larger than those of one maximal gate request or of one full engine step, whichever is larger. A request
    over either bound on its own is a group by itself (the engine admits no larger request)."""

    max_keys: int
    max_rows: int

    def groups(self, requests: list[Request]) -> list[list[Request]]:
        groups: list[list[Request]] = []
        longest = rows = 0
        for request in requests:
            n = request[0].shape[1]
            keys = n + (request[1].length if request[1] is not None else 0)
            if groups and (len(groups[-1]) + 1) * max(longest, keys) <= self.max_keys and rows + n <= self.max_rows:
                groups[-1].append(request)
                longest, rows = max(longest, keys), rows + n
            else:
                groups.append([request])
                longest, rows = keys, n
        return groups


@dataclass(frozen=True)
class Shape:
    """Requests of one attention shape: `rows` queries after `cached` prefix keys. SDPA's CPU kernels pick
    their blocking by sequence length, so requests of one shape attend in one call, unpadded, and each
    rounds as it would alone; requests of another shape, padded to it, would not (a bf16 gate's
    probabilities then moved with the pass's company: 1.7e-4 and 1.7e-3 measured on the tiny model)."""

    rows: int
    cached: int
    members: torch.Tensor  # [b] the requests of this shape
    mask: torch.Tensor | None  # [rows, cached + rows]: query s sees keys <= cached + s; None: plain causality


@dataclass(frozen=True)
class _Pack:
    """Index maps between B requests' packed rows [T] and their padded layout [B, L_max], and the requests
    grouped by attention shape."""

    positions: torch.Tensor  # [T] absolute positions
    request: torch.Tensor  # [T] each row's request
    slot: torch.Tensor  # [T] each row's index within its request
    key_slot: torch.Tensor  # [T] each row's key index: after its request's prefix keys
    last: torch.Tensor  # [B] each request's last row in the packed rows
    lengths: tuple[int, ...]
    max_rows: int
    max_keys: int
    shapes: tuple[Shape, ...]
    # Suffix mode: the KV blocks to read (each once) and where each prefix position goes.
    prefix_blocks: torch.Tensor | None = None  # [blocks]
    prefix_tokens: torch.Tensor | None = None  # [P] each prefix position's row in the blocks read
    prefix_request: torch.Tensor | None = None  # [P]
    prefix_slot: torch.Tensor | None = None  # [P]

    @staticmethod
    def of(requests: list[Request], prefix_keys: bool, block_size: int) -> _Pack:
        device = requests[0][0].device
        lengths = [rows.shape[1] for rows, _ in requests]
        starts = [prefix.length if prefix is not None else 0 for _, prefix in requests]
        cached = [start if prefix_keys else 0 for start in starts]  # prefix keys each request attends to
        request = torch.cat([torch.full((n,), b) for b, n in enumerate(lengths)])
        slot = torch.cat([torch.arange(n) for n in lengths])
        offsets = torch.tensor([0, *lengths]).cumsum(0)
        max_rows, max_keys = max(lengths), max(c + n for c, n in zip(cached, lengths, strict=True))
        members: dict[tuple[int, int], list[int]] = {}
        for b, shape in enumerate(zip(lengths, cached, strict=True)):
            members.setdefault(shape, []).append(b)
        shapes = tuple(
            Shape(rows=n, cached=c, members=torch.tensor(bs, device=device),
                  mask=None if not c else  # built on the device, only where causality is not enough
                  torch.arange(c + n, device=device)[None, :] <= c + torch.arange(n, device=device)[:, None])
            for (n, c), bs in members.items())
        fields = {}
        if any(cached):
            # Each block once (requests sharing a cached prefix share its blocks), positions mapped into them.
            needed = [prefix.blocks[:-(-c // block_size)] for (_, prefix), c in zip(requests, cached, strict=True)
                      if c]
            unique, inverse = torch.unique(torch.tensor([b for blocks in needed for b in blocks]), return_inverse=True)
            inverse = inverse.split([len(blocks) for blocks in needed])
            tokens, owners, slots = [], [], []
            for b, c in enumerate(cached):
                if not c:
                    continue
                position = torch.arange(c)
                tokens.append(inverse[len(tokens)][position // block_size] * block_size + position % block_size)
                owners.append(torch.full((c,), b))
                slots.append(position)
            fields = {"prefix_blocks": unique, "prefix_tokens": torch.cat(tokens).to(device),
                      "prefix_request": torch.cat(owners).to(device), "prefix_slot": torch.cat(slots).to(device)}
        return _Pack(
            positions=(torch.tensor(starts)[request] + slot).to(device), request=request.to(device),
            slot=slot.to(device), key_slot=(torch.tensor(cached)[request] + slot).to(device),
            last=(offsets[1:] - 1).to(device), lengths=tuple(lengths), max_rows=max_rows, max_keys=max_keys,
            shapes=shapes, **fields)


class GateBranch(nn.Module):
    """Runs the gate model's last k layers and head on gate requests' tapped rows, a step's requests at once."""

    def __init__(self, layers: list[nn.Module], final_norm: nn.Module, adapter: GateAdapter,
                 device: torch.device, workspace: Workspace, attention_fp32: bool = False,
                 prefix_keys: bool = True, max_positions: int | None = None) -> None:
        super().__init__()
        self.workspace = workspace
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
        # fp64 on CPU: torch's fp32 CPU matmuls pick their blocking by the number of rows, so a batch's
        # LoRA deltas would differ from one request's in the last bits, and bf16 rounding amplifies them;
        # in fp64 both round to the same fp32 delta. (GPU: fp32, where fp64 is slow on most cards.)
        self.lora_dtype = torch.float64 if torch.device(device).type == "cpu" else torch.float32
        self._cos_sin_fp32: dict[int, str] = {}  # rotary module id -> its fp32 cos/sin buffer, see `_rotary`
        # Every tensor kept is a copy (`copy=True`): safetensors hands out CPU tensors backed by a map of the file,
        # and one kept view (an fp32 head `.float()` returns as is) kept the whole file mapped and resident,
        # memory the KV pool is sized after.
        with safe_open(Path(adapter.path) / ADAPTER_WEIGHTS, framework="pt", device=str(device)) as weights:
            for key in weights.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if key.endswith("score.weight"):
                    head = weights.get_tensor(key).to(torch.float32, copy=True)  # [3, hidden]
                    self.register_buffer("head", head, persistent=False)
                match = _LORA_KEY.search(key)
                if match is None:
                    continue
                layer, module, ab = int(match.group(1)), match.group(2), match.group(3)
                name = f"lora_{layer}_{module}_{ab}"
                attn = self.layers[layer - self.first_layer].self_attn
                tensor = self._shard(module, ab, weights.get_tensor(key), attn)
                # Held as stored, at most fp64, at least fp32, and widened to `lora_dtype` where used (exactly):
                # held in fp64 they would double in resident memory, which the KV pool is sized after.
                held = tensor.dtype if tensor.dtype in (torch.float32, torch.float64) else torch.float32
                self.register_buffer(name, tensor.to(held, copy=True).contiguous(), persistent=False)
                a_name, b_name = self.lora_names.get((layer, module), ("", ""))
                self.lora_names[(layer, module)] = (name, b_name) if ab == "A" else (a_name, name)
        for layer in self.layers:
            rotary = layer.self_attn.rotary_emb
            if id(rotary) not in self._cos_sin_fp32 and _rotary_in_fp32(rotary, device):
                # The model's cos/sin values (already rounded to its dtype), held in fp32: built here so
                # `memory_bytes` counts them. vLLM shares one rotary module across layers: one copy. Only
                # the positions a request can have (`max_positions`, the engine's max_model_len).
                name = f"cos_sin_fp32_{len(self._cos_sin_fp32)}"
                self.register_buffer(name, rotary.cos_sin_cache[:max_positions].float(), persistent=False)
                self._cos_sin_fp32[id(rotary)] = name

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
        a, b = (getattr(self, name).to(self.lora_dtype) for name in names)  # widened: exact
        xa = x.to(self.lora_dtype) @ a.T  # [L, r]; a partial sum over this rank's input slice when `reduce`
        if reduce and self.tp_size > 1:
            from vllm.distributed import tensor_model_parallel_all_reduce

            # vLLM's CPU all-reduce has no fp64; each rank's fp64 partial sum rounds the same at any row count.
            xa = tensor_model_parallel_all_reduce(xa.float()).to(self.lora_dtype)
        return (xa @ b.T * self.scaling).float()

    def _add_lora(self, layer: int, modules: tuple[str, ...], x: torch.Tensor, out: torch.Tensor,
                  sizes: list[int]) -> torch.Tensor:
        """`out` (a fused projection's output, split by `sizes`) plus each module's LoRA delta."""
        if not any((layer, m) in self.lora_names for m in modules):
            return out
        x = x.to(self.lora_dtype)  # once for the fused modules
        deltas = [self._lora(layer, m, x) for m in modules]
        parts = list(out.split(sizes, dim=-1))
        return torch.cat([p if d is None else (p.float() + d).to(p.dtype) for p, d in zip(parts, deltas, strict=True)],
                         dim=-1)

    @torch.inference_mode()
    def forward_batch(self, requests: list[Request]) -> torch.Tensor:
        """Head logits [B, 3] (fp32) of B gate prompts in one pass. Each request's tapped rows [2, L, hidden]
        are the (hidden, residual) inputs of layer N-k's norm, of every prompt token, or with a `Prefix`
        (suffix mode) of the suffix's tokens, which follow the `prefix.length` positions in the KV cache.

        The requests' rows are packed into one [T, hidden] stream for the projections, norms and MLP;
        attention runs once per attention shape among them (`Shape`), so each request's result is what it
        would be in a pass of its own, whatever company it has. Requests are grouped (`Workspace`) so a
        group's tensors are no larger than one maximal request's or one engine step's would be."""
        outputs = [self._forward_group(group) for group in self.workspace.groups(requests)]
        return torch.cat(outputs)

    def _forward_group(self, requests: list[Request]) -> torch.Tensor:
        # Suffix mode maps prefix positions into KV blocks of the cache's own block size (`paged_kv.gather`'s).
        cached = self.prefix_keys and any(prefix is not None and prefix.length for _, prefix in requests)
        block_size = self.layers[0].self_attn.attn.kv_cache.shape[2] if cached else 1
        pack = _Pack.of(requests, self.prefix_keys, block_size)
        hidden = torch.cat([rows[0] for rows, _ in requests])  # [T, hidden]
        residual = torch.cat([rows[1] for rows, _ in requests])
        for offset, layer in enumerate(self.layers):
            index = self.first_layer + offset
            last = offset == len(self.layers) - 1
            norm = layer.input_layernorm
            h, residual = (norm.untapped if offset == 0 else norm)(hidden, residual)
            attn_out = self._attention(index, layer.self_attn, h, pack, last)
            if last:  # only each request's last row reaches the head
                residual = residual[pack.last]
            h, residual = layer.post_attention_layernorm(attn_out, residual)
            hidden = self._mlp(index, layer.mlp, h)
        normed, _ = self.final_norm[0](hidden, residual)
        # fp64: an fp32 matmul rounds by its row count, and a request's logits must not hang on its company.
        return (normed.double() @ self.head.double().T).float()  # [B, 3]

    def _attention(self, index: int, attn: nn.Module, h: torch.Tensor, pack: _Pack, last_only: bool) -> torch.Tensor:
        n, head_dim = h.shape[0], attn.head_dim
        qkv, _ = attn.qkv_proj(h)
        qkv = self._add_lora(index, QKV, h, qkv, [attn.q_size, attn.kv_size, attn.kv_size])
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        if hasattr(attn, "q_norm"):  # Qwen3's per-head norms
            q = attn.q_norm(q.reshape(n, -1, head_dim)).reshape(n, -1)
            k = attn.k_norm(k.reshape(n, -1, head_dim)).reshape(n, -1)
        q, k = self._rotary(attn.rotary_emb, pack.positions, q, k)
        heads, kv_heads = attn.num_heads, attn.num_kv_heads
        batch = len(pack.lengths)
        if last_only:  # one query per request, its last row
            queries = q[pack.last].reshape(batch, 1, heads, head_dim)
        else:
            queries = q.new_zeros(batch, pack.max_rows, heads, head_dim)
            queries[pack.request, pack.slot] = q.reshape(n, heads, head_dim)
        # Keys per request: its prefix's base K/V (suffix mode), then its own rows' K/V: [B, keys, Hkv, D].
        keys = k.new_zeros(batch, pack.max_keys, kv_heads, head_dim)
        values = torch.zeros_like(keys)
        keys[pack.request, pack.key_slot] = k.reshape(n, kv_heads, head_dim)
        values[pack.request, pack.key_slot] = v.reshape(n, kv_heads, head_dim)
        if pack.prefix_tokens is not None:
            cache = attn.attn.kv_cache
            cached_k, cached_v = paged_kv.gather(cache, attn.attn.isa, pack.prefix_blocks,
                                                 pack.prefix_blocks.numel() * cache.shape[2])
            keys[pack.prefix_request, pack.prefix_slot] = cached_k[pack.prefix_tokens]
            values[pack.prefix_request, pack.prefix_slot] = cached_v[pack.prefix_tokens]
        if self.attention_fp32:
            queries, keys, values = queries.float(), keys.float(), values.float()
        # One SDPA call per attention shape, unpadded (see `Shape`). enable_gqa shares each K/V head across its
        # query heads without copying them.
        out = queries.new_zeros(batch, queries.shape[1], heads, head_dim)
        for shape in pack.shapes:
            rows = 1 if last_only else shape.rows
            q_, k_, v_ = (t[shape.members, :n].transpose(1, 2) for t, n in
                          ((queries, rows), (keys, shape.cached + shape.rows), (values, shape.cached + shape.rows)))
            # The last query sees all its request's keys; the others causality, after the prefix keys.
            mask = None if last_only else shape.mask
            attended = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask, scale=attn.scaling,
                                                      is_causal=not last_only and mask is None, enable_gqa=True)
            out[shape.members, :rows] = attended.transpose(1, 2)  # [b, rows, H, D]
        out = out.reshape(batch, -1, attn.q_size)
        out = (out[:, 0] if last_only else out[pack.request, pack.slot]).to(h.dtype)  # [rows, H*D]
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
        name = self._cos_sin_fp32.get(id(rotary))
        if name is None or q.dtype == torch.float32:
            return rotary(positions, q, k)
        from vllm import _custom_ops as ops

        cache = getattr(self, name)
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

    def workspace_bytes(self, max_query: int, element_size: int) -> int:
        """An estimate, on the generous side, of the bytes one branch pass holds at its peak, from its
        `Workspace` bounds and the longest query a request has (`max_query`). Counted: each projection's
        output and its copies (the fused output, the fp32 part plus its LoRA delta, the concatenated
        result), the LoRA input and product and one module's matrices widened to `lora_dtype`; the
        padded queries, keys and values (and their fp32 copies where attention runs in fp32), one shape's
        unpadded copies of them, and the attention output with its gathered rows; the prefix K/V decoded
        from the cache; the shapes' masks as bools and as the float masks SDPA makes of them. torch's SDPA
        (flash on CPU) keeps no [queries x keys] scores beyond the mask. Not measured against the allocator:
        an estimate."""
        attn, mlp = self.layers[0].self_attn, self.layers[0].mlp
        size, wide = element_size, self.lora_dtype.itemsize  # activations; LoRA arithmetic
        attend = 4 if self.attention_fp32 else size
        keys, rows = self.workspace.max_keys, self.workspace.max_rows
        hidden, inner = self.head.shape[1], mlp.gate_up_proj.output_size_per_partition // 2
        projections = [(hidden, attn.q_size + 2 * attn.kv_size), (attn.q_size, hidden), (hidden, 2 * inner),
                       (inner, hidden)]  # (in, out): qkv, o, gate_up, down
        per_row = sum(width_in * wide + width_out * (2 * size + 2 * 4 + wide) for width_in, width_out in projections)
        kv_width = attn.num_kv_heads * attn.head_dim
        q_width = attn.num_heads * attn.head_dim
        padded = keys * ((q_width + 2 * kv_width) * (size + 2 * attend) + q_width * (attend + size))
        prefix = 4 * keys * kv_width * size  # the decoded pages and their positions, keys and values
        widened = max((sum(getattr(self, n).numel() for n in names) for names in self.lora_names.values()),
                      default=0) * wide
        return rows * per_row + padded + prefix + max_query * keys * (1 + 4) + widened

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of the tensors the branch owns (the layers are the base's): the LoRA matrices and the head,
        and on CPU the fp32 copy of the rotary cos/sin values."""
        def size(names) -> int:
            return sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in names)

        rotary = list(self._cos_sin_fp32.values())
        owned = [name for name, _ in self.named_buffers() if name not in rotary]
        return {"lora_and_head": size(owned), "rotary_fp32": size(rotary)}
