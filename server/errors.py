"""The service's error replies: `ApiError` for a refusal a route decides, and the exception handlers.

Every error body is OpenAI's shape, `{"error": {"message", "type", "code"}}`. Only a typed input
error maps to 400 (`gatehead.errors.InvalidInput`, raised by the runtime's, the gate's and the
agent's validation); anything else a route did not expect is a 500 whose body carries the request
id the log files the traceback under.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from gatehead.errors import InvalidInput
from gatehead.runtime.engine import GateError
from gatehead.runtime.guard import DegenerateOutput

log = logging.getLogger("gatehead.server")


class ApiError(Exception):
    """A reply a route chose: its status, message, OpenAI error type and extra headers."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers or {}


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "-")


def install_handlers(app: FastAPI) -> None:
    """The exception handlers of every route: typed refusals as themselves, the rest a 500."""

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.kind, exc.headers)

    @app.exception_handler(InvalidInput)
    async def invalid(request: Request, exc: InvalidInput) -> JSONResponse:
        return error_response(400, str(exc), "invalid_request_error")

    @app.exception_handler(GateError)
    async def gate_failed(request: Request, exc: GateError) -> JSONResponse:
        request.app.state.services.trouble()
        log.error("request %s: the gate failed: %s", request_id(request), exc)
        return error_response(500, f"the gate failed: {exc}", "gate_error")

    @app.exception_handler(DegenerateOutput)
    async def degenerate(request: Request, exc: DegenerateOutput) -> JSONResponse:
        return error_response(502, str(exc), "degenerate_output")

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        rid = request_id(request)
        log.error("request %s failed", rid, exc_info=exc)
        return error_response(500, f"gatehead failed on this request (request id {rid}); the log has the details",
                              "server_error", {"X-Request-Id": rid})
