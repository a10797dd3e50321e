"""The service's error replies: `ApiError` for a refusal a route decides, and the exception handlers.

Every error body is OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`. A request body
that fails its schema (`gatehead.server.schemas`) is a 400 naming the field in `param` (FastAPI's own
reply would be a 422 in another shape), and so is a typed input error (`gatehead.errors.InvalidInput`,
raised by the runtime's, the gate's and the agent's validation); anything else a route did not expect
is a 500 whose body carries the request id the log files the traceback under. vLLM servers that cannot serve
a request (`RemoteEngine`'s `EngineUnavailable`) are a 503.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gatehead.errors import InvalidInput
from gatehead.runtime.engine import GateError
from gatehead.runtime.guard import DegenerateOutput
from gatehead.runtime.remote import EngineUnavailable

log = logging.getLogger("gatehead.server")


class ApiError(Exception):
    """A reply a route chose: its status, message, OpenAI error type and extra headers."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers, self.param = status, message, kind, headers or {}, param


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None,
                   param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status,
                        headers=headers)


def _models() -> frozenset[str]:
    from gatehead.server.schemas import Body

    def below(cls: type) -> set[str]:
        return {cls.__name__}.union(*(below(sub) for sub in cls.__subclasses__()))
    return frozenset(below(Body))


# How pydantic names a union's scalar member in an error's location (`stop.str`, `content.list[...]`).
_TYPE_TAG = re.compile(r"^(?:str|int|float|bool|bytes|none|list|dict|tuple|set|literal|function-[a-z-]+)(?:\[.*\])?$")


def field_path(loc: tuple) -> str | None:
    """A validation error's location as OpenAI's `param` names a field: `messages[0].role` (the body's root: None;
    a union's member, which pydantic names in the location, left out)."""
    path, models = "", _models()
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        if isinstance(part, str) and (part in models or _TYPE_TAG.match(part)):
            continue
        path += f"[{part}]" if isinstance(part, int) else f"{'.' if path else ''}{part}"
    return path or None


def _nearest_member(errors: list[dict]) -> list[dict]:
    """Where the body is a union (`/v1/gate`: one item or a batch), the errors of the member it came nearest."""
    models, by_member = _models(), {}
    for error in errors:
        loc = tuple(error.get("loc", ()))
        member = loc[1] if len(loc) > 1 and isinstance(loc[1], str) and loc[1] in models else None
        by_member.setdefault(member, []).append(error)
    return min(by_member.values(), key=len) if None not in by_member else errors


def validation_response(exc: RequestValidationError) -> JSONResponse:
    """A body that fails its schema: 400, the first failing field as `param`, every failure in the message."""
    errors = _nearest_member(list(exc.errors()))
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":  # no field to name
        return error_response(400, f"the request body is not valid JSON: {first.get('msg', '')}",
                              "invalid_request_error")
    param = (first.get("ctx") or {}).get("path") or field_path(tuple(first.get("loc", ())))
    message = "; ".join(e.get("msg", "invalid") if (e.get("ctx") or {}).get("path")
                        else f"{field_path(tuple(e.get('loc', ()))) or 'body'}: {e.get('msg', 'invalid')}"
                        for e in errors) or "the request body is not valid"
    return error_response(400, message, "invalid_request_error", param=param)


def request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "-")


def install_handlers(app: FastAPI) -> None:
    """The exception handlers of every route: typed refusals as themselves, the rest a 500."""

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind, exc.headers, exc.param)

    @app.exception_handler(InvalidInput)
    async def invalid(request: Request, exc: InvalidInput) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(GateError)
    async def gate_failed(request: Request, exc: GateError) -> JSONResponse:
        request.app.state.services.trouble()
        log.error("request %s: the gate failed: %s", request_id(request), exc)
        return error_response(500, f"the gate failed: {exc}", "gate_error")

    @app.exception_handler(EngineUnavailable)
    async def unavailable(request: Request, exc: EngineUnavailable) -> JSONResponse:
        request.app.state.services.trouble()
        log.error("request %s: no vLLM server could serve it: %s", request_id(request), exc)
        return error_response(503, f"no vLLM server could serve the request: {exc}", "engine_unavailable",
                              {"Retry-After": "5"})

    @app.exception_handler(DegenerateOutput)
    async def degenerate(request: Request, exc: DegenerateOutput) -> JSONResponse:
        return error_response(502, str(exc), "degenerate_output")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        rid = request_id(request)
        log.error("request %s failed", rid, exc_info=exc)
        return error_response(500, f"gatehead failed on this request (request id {rid}); the log has the details",
                              "server_error", {"X-Request-Id": rid})
