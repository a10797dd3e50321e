"""Standalone questions: whether a model's rewrite can be used, what stands in when it cannot, and whether a
thread's first question refers to something it never named.

Pure functions of text, for any model. They read names lexically (order codes like `BG-165`, and
capitalised words not at a sentence's start); a product named in lower case ("the vale lantern") is
not seen as a name, so it neither vouches for a rewrite nor makes a first question specific.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from gatehead.agent.grounding import CITATION, normalized
from gatehead.agent.prompts import NOT_FOUND, REFUSAL

_CODE = re.compile(r"(?<![\w-])[A-Za-z]{1,5}-\d{1,6}(?![\w-])")  # order codes: BG-165, GW-960
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
_SENTENCE_END = re.compile(r"[.?!\n]")
_FIRST_PERSON = frozenset({"i", "i'm", "i'd", "i'll", "i've"})
# Words that point back at something said before; "that" only where it stands for a thing ("what does that
# cost?", "is that waterproof?"), not where it joins a clause ("a tent that sleeps four").
_POINTS_BACK = re.compile(
    r"\b(?:it|its|it's|they|them|their|theirs|those|these|this one|that one|the same)\b"
    r"|^\W*(?:and|what about|how about)\b"
    r"|^\W*that\b|\b(?:is|was|does|do|did|about|of|for|on|with|in|to|like|from|has|have|can)\s+that\b"
    r"|\bthat\W*$", re.IGNORECASE)
_OWN_OBJECT = re.compile(r"\b(?:my|our|your|a|an)\s+[^\W\d_]", re.IGNORECASE)  # "reset my lantern", "rent a kayak"


def names(text: str) -> list[str]:
    """The names `text` gives, in order: order codes, and capitalised words that do not start a sentence
    ("What is the capacity of the Summit Tent?" -> ["Summit", "Tent"]); a possessive's "'s" is dropped."""
    found = [m.group() for m in _CODE.finditer(text)]
    text = _CODE.sub(lambda m: " " * len(m.group()), text)  # a code's letters are not a word of their own
    last = 0
    starts = True  # the text's first word starts a sentence
    for m in _WORD.finditer(text):
        starts = starts or bool(_SENTENCE_END.search(text, last, m.start()))
        word = re.sub(r"['’]s$", "", m.group())
        if word[0].isupper() and not starts and word.lower().replace("’", "'") not in _FIRST_PERSON:
            found.append(word)
        starts, last = False, m.end()
    return list(dict.fromkeys(found))


def _words(texts: Iterable[str]) -> set[str]:
    """Every word and order code of `texts`, lower case, as `names` spells them."""
    out: set[str] = set()
    for text in texts:
        out.update(m.group().lower() for m in _CODE.finditer(text))
        out.update(re.sub(r"['’]s$", "", m.group()).lower() for m in _WORD.finditer(_CODE.sub(" ", text)))
    return out


def refers_back(question: str) -> bool:
    """Whether `question` points at something said before (it, its, that, they, the same; "and ...",
    "what about ...") without naming a product or bringing its own object ("my lantern", "a kayak"): on a
    thread's first turn there is nothing to point at."""
    return bool(_POINTS_BACK.search(question)) and not names(question) and not _OWN_OBJECT.search(question)


def rewrite_problem(rewrite: str, question: str, thread: Sequence[dict], *, sources: Sequence[str] = (),
                    keep_names: bool = True) -> str | None:
    """Why `rewrite`, a model's standalone form of `question`, cannot be used; None when it can.

    `thread`: the earlier turns ({"role", "text"}); `sources`: further texts whose names the rewrite may
    use (the retrieved passages, for a search rewrite, since an order-code notice names the product).
    A rewrite fails when it is empty, a refusal, an earlier answer or cites passages like an answer; when
    it names something (an order code, a capitalised word) that neither the thread, the question nor the
    sources give; and, with `keep_names`, when it drops a name the question gives ("and the Pine Tent?"
    made "... the Summit Tent?").
    """
    if not rewrite.strip():
        return "empty"
    if any(normalized(sentence) in normalized(rewrite) for sentence in (REFUSAL, NOT_FOUND)):
        return "a refusal"
    if any(t["role"] == "assistant" and normalized(t["text"]) == normalized(rewrite) for t in thread):
        return "an earlier answer"
    if CITATION.search(rewrite):
        return f"cites passages ({', '.join(f'[{n}]' for n in CITATION.findall(rewrite))}) like an answer"
    known = _words([question, *(t["text"] for t in thread), *sources])
    invented = [n for n in names(rewrite) if n.lower() not in known]
    if invented:
        return f"names {', '.join(invented)}, which neither the conversation nor the question gives"
    if keep_names:
        kept = _words([rewrite])
        dropped = [n for n in names(question) if n.lower() not in kept]
        if dropped:
            return f"drops {', '.join(dropped)}, which the question names"
    return None


def joined_question(question: str, thread: Sequence[dict]) -> str:
    """The deterministic standalone form of a follow-up: the thread's last user question, then `question`
    ("How much is the Rowan Lantern?" + "and its weight?")."""
    last = next((t["text"].strip() for t in reversed(thread) if t["role"] == "user"), "")
    return f"{last} {question.strip()}" if last else question.strip()
