"""The request bodies of the API, as pydantic models (they also make the OpenAPI schema)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

AGENT_MODEL = "gatehead-agent"  # the OpenAI API's model id of an agent turn


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """Where in a JSON value a string holds a lone surrogate (JSON's "\\ud800", which decodes to no text), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
    elif isinstance(value, dict):
        for key, item in value.items():
            found = lone_surrogate(key, path) or lone_surrogate(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if found := lone_surrogate(item, f"{path}[{index}]"):
                return found
    return None


class Body(BaseModel):
    """A request body: no string in it may hold a lone surrogate (a 400 naming the field, not a failure later
    in retrieval, the tokenizer or the log)."""

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if path := lone_surrogate(data):
            raise PydanticCustomError("lone_surrogate", "{path} holds a lone surrogate (\\ud800-\\udfff), not text",
                                      {"path": path})
        return data


class Strict(Body):
    model_config = ConfigDict(extra="forbid")


class Document(Strict):
    text: str = Field(min_length=1)
    title: str = ""
    source: str = ""
    score: float = 0.0


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str


class GateItem(Strict):
    question: str = Field(min_length=1)
    documents: list[str | Document] = Field(default_factory=list, max_length=64)
    conversation: list[Message] = Field(default_factory=list, max_length=256)
    thresholds: dict[str, float] | None = None


class GateBatch(Strict):
    items: list[GateItem] = Field(min_length=1, max_length=64)


THREAD_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ChatRequest(Strict):
    message: str = Field(min_length=1)
    thread_id: str | None = Field(default=None, min_length=1, max_length=128, pattern=THREAD_ID.pattern)
    stream: bool = False


class OpenAIMessage(Body):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(Body):
    model_config = ConfigDict(extra="allow")  # newer options gatehead does not act on (include_obfuscation)
    include_usage: bool = False  # a last chunk, with no choices, carries the completion's usage


class CompletionRequest(Body):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send fields gatehead ignores (user, metadata...)
    model: str = Field(examples=[AGENT_MODEL, "gatehead-demo"])
    messages: list[OpenAIMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens tokens whatever the model says
