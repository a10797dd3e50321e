"""Synthetic RAG workloads for fidelity checks: deterministic (question, passages, conversation) triples.

Built from templates over a small support-desk vocabulary, seeded, so every engine in a comparison
sees the same prompts. It measures mechanics (stability, agreement); it says nothing about quality,
for which the demo corpus's labelled questions exist.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gatehead.gate.prompt import Passage, PromptBuilder, Turn

_PRODUCTS = ["router", "battery", "premium plan", "laptop", "phone", "warranty", "subscription", "printer"]
_FACTS = [
    "lasts {n} hours of normal use", "costs {n} euros per month", "ships within {n} business days",
    "can be returned within {n} days", "is covered for {n} years", "resets after holding the button {n} seconds",
    "charges fully in {n} hours", "supports up to {n} devices",
]
_QUESTIONS = [
    "How long does the {p} last?", "What does the {p} cost?", "When does the {p} ship?",
    "Can I return the {p}?", "Is the {p} covered?", "How do I reset the {p}?", "Who won the match yesterday?",
    "What is the capital of the moon?",
]


@dataclass(frozen=True)
class Request:
    """One agent turn's inputs."""

    question: str
    passages: tuple[Passage, ...]
    conversation: tuple[Turn, ...] = ()


def synthetic_requests(n: int, seed: int = 0, max_passages: int = 3) -> list[Request]:
    """`n` deterministic requests with 0..max_passages passages and sometimes an earlier turn."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        product = rng.choice(_PRODUCTS)
        passages = tuple(
            Passage(text=f"The {rng.choice(_PRODUCTS)} {rng.choice(_FACTS).format(n=rng.randint(1, 60))}.",
                    title=f"Article {rng.randint(1, 500)}", source=f"kb/{rng.randint(1, 99)}.md",
                    score=round(rng.random(), 3))
            for _ in range(rng.randint(0, max_passages)))
        turns = (Turn("user", f"Tell me about the {rng.choice(_PRODUCTS)}."),
                 Turn("assistant", f"The {product} {rng.choice(_FACTS).format(n=rng.randint(1, 9))}.")) \
            if i % 3 == 0 else ()
        requests.append(Request(rng.choice(_QUESTIONS).format(p=product), passages, turns))
    return requests


def synthetic_prompts(builder: PromptBuilder, n: int, seed: int = 0, kind: str = "gate") -> list[tuple[int, ...]]:
    """The `kind` ("gate" or "answer") prompts of `synthetic_requests(n, seed)`, laid out by `builder`."""
    if kind not in ("gate", "answer"):
        raise ValueError(f"kind must be 'gate' or 'answer', got {kind!r}")
    return [getattr(builder.build(r.question, r.passages, r.conversation), kind) for r in synthetic_requests(n, seed)]
