"""The fast tier's fixtures: the scripted engine (`gatehead.testing.ScriptedEngine`) on the tiny model's tokenizer."""

from __future__ import annotations

import pytest

from gatehead.testing import ScriptedEngine


@pytest.fixture
def engine(tiny, tokenizer):
    """`engine(*decisions, **fields)`: a scripted engine whose gates decide `decisions` in order."""
    def make(*decisions: str, **fields) -> ScriptedEngine:
        return ScriptedEngine(tokenizer, tiny.adapter, list(decisions), **fields)
    return make
