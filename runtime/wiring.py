"""The engine-to-worker contract: what a gated model needs beyond its checkpoint, and the one place it is read.

The engine (or `vllm serve` started with these overrides) hands its workers a `Wiring` inside vLLM's
`hf_overrides`, under one key: the gate adapter's folder (validated against the base by the engine, read
by the worker without checking again), the suffix and action token ids, the longest gate prompt, and the
stability check's diagnostic switches. `GateState` reads it back with `Wiring.of(hf_config)`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

KEY = "gatehead_wiring"  # the hf_config attribute, set through hf_overrides


@dataclass(frozen=True)
class Wiring:
    adapter: str  # the gate adapter's folder, absolute
    suffix_ids: tuple[int, ...]  # the suffix's token ids (its last one is the reserved gate token)
    action_ids: tuple[int, ...]  # the action tokens' ids, in the adapter's label order
    max_gate_tokens: int  # the longest gate prompt a request may have
    # The stability check's diagnostics (`EngineConfig.tap` and `.branch`): the tap's write-back, no tap,
    # no branch, and the suffix gate's negative control.
    tap: Literal["copy", "perturbed", "off"] = "copy"
    branch: bool | Literal["suffix-only"] = True

    def overrides(self, architecture: str) -> dict[str, Any]:
        """vLLM's `hf_overrides`: the gated architecture in place of the base's, and this wiring."""
        return {"architectures": [architecture], KEY: {**asdict(self), "suffix_ids": list(self.suffix_ids),
                                                       "action_ids": list(self.action_ids)}}

    @classmethod
    def of(cls, hf_config: Any) -> Wiring:
        """The wiring a worker was started with; a clear error where a gated architecture has none."""
        data = getattr(hf_config, KEY, None)
        if not isinstance(data, dict):
            raise ValueError(f"a gatehead gated architecture was loaded without gatehead's wiring (hf_overrides "
                             f"{KEY!r}): start it through gatehead's engine, which sets it")
        return cls(adapter=str(data["adapter"]), suffix_ids=tuple(int(t) for t in data["suffix_ids"]),
                   action_ids=tuple(int(t) for t in data["action_ids"]), max_gate_tokens=int(data["max_gate_tokens"]),
                   tap=data.get("tap", "copy"), branch=data.get("branch", True))
