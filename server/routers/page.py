"""The chat page at `/` and its two static files (plain HTML, CSS and JavaScript; no build step)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from gatehead.server.errors import ApiError

router = APIRouter(include_in_schema=False)
PAGE_FILES = {"chat.js": "text/javascript", "chat.css": "text/css"}
# The page and its two files hold no data: they load without a key (the page asks for one).
PAGE_PATHS = ("/", *(f"/static/{name}" for name in PAGE_FILES))
STATIC = Path(__file__).parent.parent / "static"
HEADERS = {"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
           "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


@router.get("/")
async def chat_page() -> FileResponse:
    return FileResponse(STATIC / "chat.html", media_type="text/html", headers=HEADERS)


@router.get("/static/{name}")
async def page_file(name: str) -> FileResponse:
    if name not in PAGE_FILES:
        raise ApiError(404, "no such file", "not_found_error")
    return FileResponse(STATIC / name, media_type=PAGE_FILES[name], headers=HEADERS)
