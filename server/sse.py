"""Server-sent events: the two wire formats the service streams in, and the one error wrapper of every stream.

The agent's own stream sends named events (`event: token`, `node`, `final`, `error`,
`degenerate_output`); the OpenAI-compatible API sends `data:` chunks and reports an error as a chunk
with OpenAI's error body. Once a stream has started its status line has gone, so `with_errors`
turns whatever fails inside it into one last error event in the stream's own format.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from gatehead.errors import InvalidInput
from gatehead.runtime.guard import DegenerateOutput
from gatehead.runtime.remote import EngineUnavailable
from gatehead.server.errors import ApiError

log = logging.getLogger("gatehead.server")
# (status code, OpenAI error type, message, details) -> the stream's error event
ErrorEvent = Callable[[int, str, str, dict], str]


def event(kind: str, data: dict) -> str:
    """A named event of the agent's stream."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def agent_error(code: int, kind: str, message: str, details: dict) -> str:
    if kind == "degenerate_output":  # the answer so far was sent; the rest failed the guard
        return event("degenerate_output", {"message": message, **details, "code": code})
    return event("error", {"message": message, "code": code})


def chunk(completion_id: str, model: str, delta: dict | None, finish: str | None, extra: dict | None = None,
          usage: dict | None | bool = False) -> str:
    """One `chat.completion.chunk`; `extra` goes under the `gatehead` key. With `stream_options.include_usage`
    every chunk has a `usage` key (None) and the last one, `delta` None, has no choices and the usage."""
    body = {"id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not False:
        body["usage"] = usage
    if extra is not None:
        body["gatehead"] = extra
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def openai_error(code: int, kind: str, message: str, details: dict) -> str:
    body = {"error": {"message": message, "type": kind, "param": details.get("param"), "code": code}}
    return f"data: {json.dumps(body)}\n\n"


DONE = "data: [DONE]\n\n"


async def with_errors(events: AsyncIterator[str], error: ErrorEvent, request_id: str,
                      on_failure: Callable[[], None]) -> AsyncIterator[str]:
    """`events`, ended by one error event if they fail: a refusal as itself, a guard trip as 502, an input
    error as 400, anything else as 500 (logged with the request id; `on_failure` is told)."""
    try:
        async with aclosing(events) as inner:
            async for item in inner:
                yield item
    except ApiError as exc:
        yield error(exc.status, exc.kind, exc.message, {"param": exc.param})
    except EngineUnavailable as exc:  # the server streaming it failed; never repeated elsewhere
        log.error("request %s: the vLLM server failed: %s", request_id, exc)
        on_failure()
        yield error(503, "engine_unavailable", f"no vLLM server could finish the request: {exc}", {})
    except DegenerateOutput as exc:
        yield error(502, "degenerate_output", str(exc), {"reason": exc.trip.reason})
    except InvalidInput as exc:
        yield error(400, "invalid_request_error", str(exc), {})
    except Exception as exc:  # noqa: BLE001 - the stream has started: the error is its last event
        log.error("request %s: the stream failed", request_id, exc_info=exc)
        on_failure()
        yield error(500, "server_error", f"gatehead failed on this request (request id {request_id}): "
                                         f"{type(exc).__name__}", {})
