"""Shared fixtures: tiny models are built once per session and shared by every test."""

from __future__ import annotations

import pytest

from gatehead.retrieval.config import EmbedderConfig
from gatehead.retrieval.embedder import Embedder
from gatehead.runtime.tiny import TinyModel, TinySpec, build_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """The default tiny Qwen3 model (6 layers, k=4) and its random gate adapter."""
    return build_tiny(tmp_path_factory.mktemp("tiny"), TinySpec())


@pytest.fixture(scope="session")
def tiny_other(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """Same shape as `tiny`, other weights: a wrong base for `tiny`'s adapter."""
    return build_tiny(tmp_path_factory.mktemp("tiny-other"), TinySpec(seed=1))


@pytest.fixture(scope="session")
def tokenizer(tiny: TinyModel):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny.model_dir)


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The bundled all-MiniLM-L6-v2, loaded once for every test that embeds."""
    embedder = Embedder(EmbedderConfig(device="cpu"))
    assert embedder.dimension == 384  # loads the model, here and only here
    return embedder
