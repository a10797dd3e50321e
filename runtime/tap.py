"""The tap: a custom op that copies the residual stream at layer N-k into a persistent buffer.

It sits right after layer N-k's `input_layernorm(hidden, residual)`, whose `residual` output is the
bf16 sum the HF model feeds layer N-k. The op only copies (`buf[:n] = residual`): it adds no
arithmetic to the compiled region, so the base model's fused graph (and its bf16 rounding) stays the
stock one. It copies every row of the step, whatever the requests are: the op then has no
per-step input, so torch.compile can't bake a stale plan into the graph, and a CUDA graph replays
the same copy between the same persistent addresses. The branch picks gate rows out of the buffer
after the forward, in eager mode.

`perturbed` mode writes a rounding change back into the stream: it exists only as the negative
control that proves the answer-stability check can fail.
"""

from __future__ import annotations

import torch
from torch.library import Library

_LIB = Library("gatehead", "FRAGMENT")  # the ops live as long as this object
_PERTURBATION = 1.0 + 2.0**-7  # about one bf16 ulp


def _tap(residual: torch.Tensor, buf: torch.Tensor) -> None:
    buf[: residual.shape[0]].copy_(residual)


def _tap_perturbed(residual: torch.Tensor, buf: torch.Tensor) -> None:
    residual.mul_(_PERTURBATION)
    buf[: residual.shape[0]].copy_(residual)


def _fake(residual: torch.Tensor, buf: torch.Tensor) -> None:
    return None


def _register() -> None:
    from vllm.utils.torch_utils import direct_register_custom_op

    if hasattr(torch.ops.gatehead, "tap"):
        return
    direct_register_custom_op("tap", _tap, mutates_args=["buf"], fake_impl=_fake, target_lib=_LIB)
    direct_register_custom_op("tap_perturbed", _tap_perturbed, mutates_args=["residual", "buf"],
                              fake_impl=_fake, target_lib=_LIB)


def tap_norm(norm: torch.nn.Module, buf: torch.Tensor, perturbed: bool = False) -> None:
    """Make `norm` (a vLLM RMSNorm called as `norm(hidden, residual)`) tap its residual output into `buf`."""
    _register()
    key = (type(norm), perturbed)
    if key not in _CLASSES:
        name = f"{'Perturbed' if perturbed else 'Tapped'}{type(norm).__name__}"
        op = torch.ops.gatehead.tap_perturbed if perturbed else torch.ops.gatehead.tap
        _CLASSES[key] = type(name, (type(norm),), {"forward": _forward, "gatehead_op": staticmethod(op)})
    norm.__class__ = _CLASSES[key]
    norm.register_buffer("gatehead_tap", buf, persistent=False)


_CLASSES: dict[tuple[type, bool], type] = {}


def _forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
    if residual is None:  # the branch normalising the tapped rows: nothing to tap
        return super(type(self), self).forward(x)
    hidden, residual = super(type(self), self).forward(x, residual)
    self.gatehead_op(residual, self.gatehead_tap)
    return hidden, residual
