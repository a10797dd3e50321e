"""What a generated answer says: whether it is the refusal sentence, and whether its cited passages carry it.

Pure functions of text, for any model. The grounding check is lexical: it catches a citation that
points nowhere, a missing citation, and a value (a number, a name) the cited passage does not hold; it
does not judge whether a sentence built from the passage's own words means what the passage means.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gatehead.agent.prompts import NOT_FOUND, REFUSAL
from gatehead.gate.prompt import Passage

CITATION = re.compile(r"\[(\d+)\]")  # how the answer prompt asks the model to cite: [1], [2], ...
_SPACE = re.compile(r"\s+")
_BEFORE_MARK = re.compile(r"\s+([.,;:!?])")  # "€199 [1]." loses its marker and leaves "€199 ."
_EDGES = " \t\n.,;:!?\"'“”‘’(){}*_-–—"
_TOKEN = re.compile(r"[^\s/–—-]+")  # "2-year" is "2" and "year"; "BG-165" is "BG" and "165"
# Sentence-initial function words: capitalised by position, never the value an answer gives.
_COMMON = frozenset("a an the it its this that these those they there yes no i you we he she in on at for of to "
                    "and but or if when after before with by from each every all both".split())


def normalized(text: str) -> str:
    """`text` compared as the agent compares texts: lower case, one space, no surrounding punctuation."""
    text = _BEFORE_MARK.sub(r"\1", text.replace("’", "'").replace("‘", "'"))
    return _SPACE.sub(" ", text).strip(_EDGES).lower()


def is_refusal(answer: str) -> bool:
    """Whether `answer` is one of the agent's refusal sentences (`REFUSAL`, `NOT_FOUND`), or starts with one."""
    said = normalized(answer)
    return any(said.startswith(normalized(sentence)) for sentence in (REFUSAL, NOT_FOUND))


def cited_passages(answer: str, passages: Sequence[Passage]) -> list[Passage] | None:
    """The passages the answer's `[n]` markers point at, numbered from 1 in prompt order; None when a marker
    points at no passage."""
    numbers = sorted({int(n) for n in CITATION.findall(answer)})
    if any(not 0 < n <= len(passages) for n in numbers):
        return None
    return [passages[n - 1] for n in numbers]


def grounded(answer: str, passages: Sequence[Passage]) -> bool:
    """Whether `answer` cites the passages it was given (`passages`: those its prompt kept, in prompt order)
    and says what the cited ones say.

    False when it cites nothing or a number past the passages. Otherwise true when the answer without its
    markers occurs in a cited passage (both normalized), or else when every number-bearing token and every
    capitalised word of the answer (bar function words such as a sentence-initial "The") occurs in the cited
    passages, each number with the unit word that follows it ("880 g" is not "880 lumens").
    """
    cited = cited_passages(answer, passages)
    if not cited:
        return False
    said = normalized(CITATION.sub("", answer))
    texts = [normalized(f"{p.title}\n{p.text}") for p in cited]
    if said and any(said in text for text in texts):
        return True
    words = [w for w in (t.strip(_EDGES) for t in _TOKEN.findall(CITATION.sub(" ", answer))) if w]
    values = [normalized(w).removesuffix("'s") for w in words
              if any(c.isdigit() for c in w) or (w[0].isupper() and w.lower() not in _COMMON)]
    # A number's unit is part of its value: "880 g" is not in "880 lumens" ("2-year" is in "2 years").
    units = [(normalized(w), unit.lower()) for w, unit in zip(words, words[1:], strict=False)
             if any(c.isdigit() for c in w) and unit.isalpha() and unit.islower() and unit not in _COMMON]
    return all(_occurs(v, texts) for v in values) and all(
        any(_occurs(f"{number} {form}", texts) for form in (unit, unit + "s", unit.removesuffix("s")))
        for number, unit in units)


def _occurs(value: str, texts: Sequence[str]) -> bool:
    """`value` as a whole token in one of `texts`: "€19" is not in "€199", "2" is in "2 years"."""
    pattern = re.compile(rf"(?<!\w){re.escape(value)}(?!\w)")
    return any(pattern.search(text) for text in texts)
