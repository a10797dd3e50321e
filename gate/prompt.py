"""Prompt layout: the shared prefix P, the gate prompt P + suffix and the answer prompt P + assistant start.

P = system + retrieved documents + conversation + question, laid out by the model's own chat template.
Both prompts carry P's token ids unchanged, so the answer request reuses the gate request's prefill.

Safety: text from users and documents is tokenized with special-token parsing off
(`split_special_tokens=True`), so it can never produce the invocation suffix or any other reserved
token; only the chat template's markup and the suffix are parsed for special tokens.

Budget: P must leave room in the model's window for the longer of the two endings plus the answer;
the oldest turns go first, then the lowest-scored passages, always whole (never cut mid-token).
This module builds token ids; it does not run a model or check the engine-side routing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gatehead.errors import InvalidInput

DEFAULT_SYSTEM = (
    "You are a helpful assistant. Answer the user's question using only the documents below, "
    "and cite them by number. If they do not contain the answer, say so."
)
_SENTINEL = "\x00gatehead-{}\x00"


@dataclass(frozen=True)
class Passage:
    """A retrieved passage."""

    text: str
    title: str = ""
    source: str = ""
    score: float = 0.0


@dataclass(frozen=True)
class Turn:
    """One earlier message of the conversation."""

    role: Literal["user", "assistant"]
    text: str


@dataclass(frozen=True)
class PromptConfig:
    """How prompts are laid out and budgeted."""

    max_context: int  # the model's window in tokens (vLLM's max_model_len)
    system: str = DEFAULT_SYSTEM
    answer_tokens: int = 256  # room kept after P for the answer

    def __post_init__(self) -> None:
        if self.answer_tokens < 1 or self.max_context <= self.answer_tokens:
            raise ValueError(f"max_context ({self.max_context}) must exceed answer_tokens ({self.answer_tokens}) >= 1")


@dataclass(frozen=True)
class Dropped:
    """What the context budget left out, as indices into the caller's lists."""

    turns: tuple[int, ...] = ()
    passages: tuple[int, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """Token ids of one request's two prompts; `gate` and `answer` both start with `prefix`."""

    prefix: tuple[int, ...]
    gate: tuple[int, ...]
    answer: tuple[int, ...]
    passages: tuple[Passage, ...]  # the passages kept, in prompt order ([1], [2], ...)
    dropped: Dropped


def reserved_token_id(tokenizer: Any, token: str) -> int:
    """The id of `token`, which must be one special token of `tokenizer`."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1 or ids[0] not in set(tokenizer.all_special_ids):
        raise ValueError(f"{token!r} is not a single special token of the tokenizer (it encodes to {ids}); "
                         f"add it as an additional special token or pick a reserved one the tokenizer has")
    return ids[0]


def encode_untrusted(tokenizer: Any, text: str) -> list[int]:
    """Token ids of untrusted text, with special-token parsing off."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def format_passage(number: int, passage: Passage) -> str:
    """How one passage appears in the documents block."""
    head = f"[{number}] {passage.title}".rstrip()
    if passage.source:
        head += f" ({passage.source})"
    return f"\n\n{head}\n{passage.text}"


class PromptBuilder:
    """Builds gate and answer prompts for one tokenizer and gate suffix."""

    def __init__(self, tokenizer: Any, suffix: str, config: PromptConfig) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.suffix_ids = tuple(tokenizer.encode(suffix, add_special_tokens=False))
        if not self.suffix_ids or self.suffix_ids[-1] not in set(tokenizer.all_special_ids):
            raise ValueError(f"the gate suffix {suffix!r} must end with a special token of the tokenizer")
        self.reserved_ids = frozenset(tokenizer.all_special_ids)

    @property
    def max_context(self) -> int:
        """The context the layout fits prompts into (tokens)."""
        return self.config.max_context

    @property
    def answer_tokens(self) -> int:
        """Tokens the layout keeps free for the answer."""
        return self.config.answer_tokens

    def build(self, question: str, passages: Sequence[Passage] = (), conversation: Sequence[Turn] = ()) -> Prompt:
        """Lay out P for `question` and return both prompts, within the context budget."""
        if not question.strip():
            raise InvalidInput("the question is empty")
        for turn in conversation:
            if turn.role not in ("user", "assistant"):
                raise InvalidInput(f"conversation roles are 'user' and 'assistant', got {turn.role!r}")
        system_ids = encode_untrusted(self.tokenizer, self.config.system + "\n\nDocuments:")
        question_ids = encode_untrusted(self.tokenizer, question)
        turn_ids = [encode_untrusted(self.tokenizer, t.text) for t in conversation]
        turns = list(range(len(conversation)))
        kept = list(range(len(passages)))
        dropped_turns: list[int] = []
        dropped_passages: list[int] = []
        while True:
            blocks = [format_passage(n + 1, passages[i]) for n, i in enumerate(kept)]
            documents = [t for b in blocks for t in encode_untrusted(self.tokenizer, b)]
            documents = documents or encode_untrusted(self.tokenizer, " none")
            messages = [("system", system_ids + documents)]
            messages += [(conversation[i].role, turn_ids[i]) for i in turns]
            messages.append(("user", question_ids))
            prefix, assistant_start = self._render(messages)
            ending = max(len(self.suffix_ids), len(assistant_start))
            if len(prefix) + ending + self.config.answer_tokens <= self.config.max_context:
                break
            if turns:
                dropped_turns.append(turns.pop(0))
                while turns and conversation[turns[0]].role == "assistant":  # keep turns starting with a user
                    dropped_turns.append(turns.pop(0))
            elif kept:
                lowest = min(kept, key=lambda i: (passages[i].score, -i))
                kept.remove(lowest)
                dropped_passages.append(lowest)
            else:
                raise InvalidInput(
                    f"the system prompt and question alone take {len(prefix)} tokens; with "
                    f"{self.config.answer_tokens} for the answer they exceed the {self.config.max_context}-token "
                    f"window: shorten the question or the system prompt, or lower answer_tokens")
        prefix_t = tuple(prefix)
        prompt = Prompt(
            prefix=prefix_t,
            gate=prefix_t + self.suffix_ids,
            answer=prefix_t + tuple(assistant_start),
            passages=tuple(passages[i] for i in kept),
            dropped=Dropped(tuple(sorted(dropped_turns)), tuple(sorted(dropped_passages))),
        )
        assert self.suffix_ids[-1] not in prefix_t, "the suffix token leaked into P"
        return prompt

    def chat(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        """Token ids of a plain chat (no documents) ending with the assistant start; all text untrusted."""
        if not messages:
            raise InvalidInput("the conversation is empty")
        for role, _ in messages:
            if role not in ("system", "user", "assistant"):
                raise InvalidInput(f"message roles are 'system', 'user' and 'assistant', got {role!r}")
        prefix, start = self._render([(role, encode_untrusted(self.tokenizer, text)) for role, text in messages])
        return prefix + start

    def _render(self, messages: list[tuple[str, list[int]]]) -> tuple[list[int], list[int]]:
        """P's ids and the assistant-start ids, from the chat template rendered around sentinels."""
        chat = [{"role": role, "content": _SENTINEL.format(i)} for i, (role, _) in enumerate(messages)]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False)
        with_start = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        if not with_start.startswith(text):
            raise ValueError("the chat template's generation prompt does not extend the conversation; "
                             "gatehead needs a template where it does (as ChatML, Llama 3 and Qwen do)")
        start = self.tokenizer.encode(with_start[len(text):], add_special_tokens=False)
        ids: list[int] = []
        for i, (_, content) in enumerate(messages):
            sentinel = _SENTINEL.format(i)
            if text.count(sentinel) != 1:
                raise ValueError("the chat template dropped or repeated a message; gatehead needs one "
                                 "that renders each message's content once, unchanged")
            markup, text = text.split(sentinel)
            ids += self.tokenizer.encode(markup, add_special_tokens=False) + content
        ids += self.tokenizer.encode(text, add_special_tokens=False)
        return ids, start
