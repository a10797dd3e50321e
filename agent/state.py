"""The agent's state, its settings and what a turn returns: the data the graph's nodes read and write."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Literal, TypedDict

from gatehead.gate.policy import Decision, Thresholds
from gatehead.gate.prompt import Passage, Turn

__all__ = ["AgentConfig", "AgentEvent", "AgentState", "Decision", "Outcome", "TurnResult", "as_passage", "turns_of"]
Outcome = Literal["answer", "refuse", "not_found", "clarify", "error"]  # how a turn ends


@dataclass(frozen=True)
class AgentConfig:
    """How the agent runs a turn."""

    top_k: int = 3  # passages per retrieval (the demo model was trained on 3)
    max_searches: int = 2  # query rewrites per turn before it gives up with NOT_FOUND
    max_answer_tokens: int = 128
    max_rewrite_tokens: int = 48
    thresholds: Thresholds | None = None  # default: the adapter's calibrated ones
    # Submit the answer beside the gate and hold it until the gate decides (`gatehead.agent.held`): one
    # queueing instead of two; a refused or searched turn aborts it, its decode tokens counted as wasted.
    answer_beside_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("top_k", "max_answer_tokens", "max_rewrite_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_searches < 0:
            raise ValueError(f"AgentConfig.max_searches must be >= 0, got {self.max_searches}")


def _log(old: list | None, new: list | None) -> list:
    """Reducer of the per-turn logs: appends; None starts the log afresh (at the start of a turn)."""
    return [] if new is None else [*(old or []), *new]


class AgentState(TypedDict, total=False):
    """The graph's state. `question` is the input; `history` persists across the thread's turns."""

    question: str  # the user's message this turn
    history: list[dict]  # earlier turns of the thread: {"role": "user" | "assistant", "text": ...}
    standalone: str  # the question made standalone for retrieval (the question itself on a first turn)
    ask: str  # what the gate and the answer are asked: the question, or the last rewrite after a search
    queries: Annotated[list[str], _log]  # every retrieval query of the turn
    passages: list[dict]  # the last retrieval's passages (text, title, source, score)
    gates: Annotated[list[dict], _log]  # every gate call: query, probs, decision (+ wasted_answer_tokens: its
    # held answer's decode tokens, where one was started beside it and aborted)
    searches: int  # rewrites done this turn
    decision: Outcome | Literal[""]  # "" until the turn ends
    answer: str
    refusal_reason: Literal["", "gate", "generated"]  # a refusal's origin: the gate's decision, or the model's words
    grounded: bool | None  # an answer's check against its cited passages (`gatehead.agent.grounding`); else None
    rewrite_fallbacks: Annotated[list[dict], _log]  # rewrites not used: node, rewrite, used, reason
    finish_reason: str  # why the answer ended: "stop", or "length" at the token budget
    dropped: dict  # what the context budget left out of the last gate prompt: turns, passage sources
    timings: Annotated[list[dict], _log]  # per node run: node, seconds (+ ttft, cached and answer tokens, held:
    # generate)
    error: str


def as_passage(item: Any) -> Passage:
    """A passage from a retrieval result: `Passage`, a store `Hit`, a LangChain `Document`, a dict or a string."""
    if isinstance(item, Passage):
        return item
    if isinstance(item, str):
        return Passage(text=item)
    if hasattr(item, "to_passage"):
        return item.to_passage()
    if hasattr(item, "page_content"):  # langchain_core.documents.Document
        meta = dict(getattr(item, "metadata", None) or {})
        return Passage(text=item.page_content, title=str(meta.get("title", "")), source=str(meta.get("source", "")),
                       score=float(meta.get("score", 0.0)))
    if isinstance(item, dict) and "text" in item:
        return Passage(text=str(item["text"]), title=str(item.get("title", "")), source=str(item.get("source", "")),
                       score=float(item.get("score", 0.0)))
    raise TypeError(f"cannot use {type(item).__name__} as a passage: give a Passage, a Hit, a Document, a dict "
                    f"with 'text', or a string")


def turns_of(history: Sequence[dict]) -> list[Turn]:
    """A thread's history as the prompt layout's turns."""
    return [Turn(t["role"], t["text"]) for t in history]


USAGE_KEYS = ("prompt_tokens", "cached_tokens", "completion_tokens")


@dataclass(frozen=True)
class TurnResult:
    """What one turn did and said."""

    thread_id: str
    question: str
    standalone: str  # the question made standalone for retrieval
    decision: Outcome
    answer: str  # empty when the turn failed
    gates: list[dict]  # every gate call: query, probs {answer, refuse, search}, decision (+ wasted_answer_tokens)
    queries: list[str]  # every retrieval query
    passages: list[Passage]  # those the last gate and the answer saw, in prompt order
    dropped: dict  # what the context budget left out of the last gate prompt: turn indices, passage sources
    timings: list[dict]  # per node run, in order: node, seconds (+ ttft, cached_tokens, completion_tokens, held for
    # generate: ttft counts from the answer's submission, beside the gate where held)
    error: str = ""
    finish_reason: str = "stop"  # "length" when the answer stopped at its token budget
    refusal_reason: str = ""  # for decision "refuse": "gate" (the gate refused) or "generated" (the model did)
    grounded: bool | None = None  # for decision "answer": whether its citations point at passages that carry it
    rewrite_fallbacks: list[dict] = field(default_factory=list)  # model rewrites not used: node, rewrite, used, reason

    @property
    def sources(self) -> list[str]:
        return [p.source for p in self.passages]

    @property
    def generated(self) -> bool:
        """Whether the answer is the model's (its tokens were streamed), not a sentence the agent says itself."""
        return any(t["node"] == "generate" for t in self.timings)

    @property
    def usage(self) -> dict:
        """The tokens the turn's engine requests spent, by node (gate, contextualize, rewrite, generate) and in all:
        prompt tokens (the prefix cache's share among them as `cached_tokens`) and completion tokens (answer
        and rewrite text, and the tokens of an answer held beside a gate that did not say answer)."""
        nodes: dict[str, dict[str, int]] = {}
        for entry in self.timings:
            if "prompt_tokens" in entry:
                sums = nodes.setdefault(entry["node"], dict.fromkeys(USAGE_KEYS, 0))
                for key in USAGE_KEYS:
                    sums[key] += int(entry.get(key, 0))
        total = {key: sum(n[key] for n in nodes.values()) for key in USAGE_KEYS}
        return {**total, "total_tokens": total["prompt_tokens"] + total["completion_tokens"], "nodes": nodes}

    @property
    def probs(self) -> dict[str, float]:
        """The last gate call's probabilities."""
        return self.gates[-1]["probs"] if self.gates else {}

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sources"] = self.sources
        out["usage"] = self.usage
        return out

    @classmethod
    def from_state(cls, thread_id: str, state: dict) -> TurnResult:
        passages = [as_passage(p) for p in state.get("passages") or []]
        return cls(thread_id=thread_id, question=state.get("question", ""), standalone=state.get("standalone", ""),
                   decision=state.get("decision", ""), answer=state.get("answer", ""),
                   gates=list(state.get("gates") or []), queries=list(state.get("queries") or []),
                   passages=passages, dropped=dict(state.get("dropped") or {}),
                   timings=list(state.get("timings") or []), error=state.get("error", ""),
                   finish_reason=state.get("finish_reason") or "stop", refusal_reason=state.get("refusal_reason", ""),
                   grounded=state.get("grounded"), rewrite_fallbacks=list(state.get("rewrite_fallbacks") or []))


@dataclass(frozen=True)
class AgentEvent:
    """One streamed event: `node` (a node finished; `data` is its update), `token` (answer text) or `final`."""

    kind: Literal["node", "token", "final"]
    node: str = ""
    text: str = ""
    data: dict = field(default_factory=dict)
    result: TurnResult | None = None
