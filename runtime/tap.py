"""The tap: a custom op that copies the residual stream at layer N-k into a persistent buffer.

It sits right before layer N-k's `input_layernorm(hidden, residual)` and copies both of its inputs
(`buf[0, :n] = hidden`, `buf[1, :n] = residual`), so the branch calls the same norm on the same
values and its first layer starts bit-identical to the base's layer N-k. (Copying only the norm's
`residual` output, the bf16 sum, is not enough: vLLM's fused add-norm normalises the fp32 sum before
rounding it, so a norm recomputed from the rounded sum is off by one bf16 rounding of every element,
which on CPUs that emulate bf16 put near-tie gates well outside the dedicated engine's reach.)
The op only copies: it adds no arithmetic to the compiled region, so the base model's fused graph
(and its bf16 rounding) stays the stock one. It copies every row of the step, whatever the requests
are: the op then has no per-step input, so torch.compile can't bake a stale plan into the graph, and
a CUDA graph replays the same copy between the same persistent addresses. The branch picks gate rows
out of the buffer after the forward, in eager mode.

`perturbed` mode writes a rounding change back into the stream: it exists only as the negative
control that proves the answer-stability check can fail.
"""

from __future__ import annotations

import torch
from torch.library import Library

_LIB = Library("gatehead", "FRAGMENT")  # the ops live as long as this object
_PERTURBATION = 1.0 + 2.0**-7  # about one bf16 ulp


def _tap(hidden: torch.Tensor, residual: torch.Tensor, buf: torch.Tensor) -> None:
    buf[0, : hidden.shape[0]].copy_(hidden)
    buf[1, : residual.shape[0]].copy_(residual)


def _tap_perturbed(hidden: torch.Tensor, residual: torch.Tensor, buf: torch.Tensor) -> None:
    residual.mul_(_PERTURBATION)
    _tap(hidden, residual, buf)


def _fake(hidden: torch.Tensor, residual: torch.Tensor, buf: torch.Tensor) -> None:
    return None


def _register() -> None:
    from vllm.utils.torch_utils import direct_register_custom_op

    if hasattr(torch.ops.gatehead, "tap"):
        return
    direct_register_custom_op("tap", _tap, mutates_args=["buf"], fake_impl=_fake, target_lib=_LIB)
    direct_register_custom_op("tap_perturbed", _tap_perturbed, mutates_args=["residual", "buf"],
                              fake_impl=_fake, target_lib=_LIB)


def tap_norm(norm: torch.nn.Module, buf: torch.Tensor, perturbed: bool = False) -> None:
    """Make `norm` (a vLLM RMSNorm called as `norm(hidden, residual)`) tap its inputs into `buf` [2, rows, hidden].

    The branch calls `norm.untapped(hidden, residual)`: the same norm without the tap.
    """
    _register()
    key = (type(norm), perturbed)
    if key not in _CLASSES:
        name = f"{'Perturbed' if perturbed else 'Tapped'}{type(norm).__name__}"
        op = torch.ops.gatehead.tap_perturbed if perturbed else torch.ops.gatehead.tap
        _CLASSES[key] = type(name, (type(norm),), {"forward": _forward, "untapped": _untapped,
                                                   "gatehead_op": staticmethod(op)})
    norm.__class__ = _CLASSES[key]
    norm.register_buffer("gatehead_tap", buf, persistent=False)


_CLASSES: dict[tuple[type, bool], type] = {}


def _forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
    assert residual is not None, "layer N-k > 0 always gets a residual"
    self.gatehead_op(x, residual, self.gatehead_tap)
    return super(type(self), self).forward(x, residual)


def _untapped(self, x: torch.Tensor, residual: torch.Tensor):
    return super(type(self), self).forward(x, residual)
