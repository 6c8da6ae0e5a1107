"""The chat page: GET / (index.html) and GET /static/<file> (its script and style sheet).

Plain files, no build step: the page talks to this same API (/v1/models, streaming
/v1/chat/completions) from the browser, with the API key the user types in (kept in the
browser's localStorage), so it needs no auth of its own and holds no secret.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.errors import ApiError

STATIC_DIR = Path(__file__).parent / "static"
# NOTE: an allow-list, not a directory mount: no path from the URL ever reaches the file system.
STATIC_FILES = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
# The page loads nothing from elsewhere and talks only to this origin.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@router.get("/static/{name}")
async def static_file(name: str) -> FileResponse:
    media_type = STATIC_FILES.get(name)
    if media_type is None:
        raise ApiError(404, f"no static file {name!r}; there are: {sorted(STATIC_FILES)}", code="not_found")
    return FileResponse(STATIC_DIR / name, media_type=media_type, headers=SECURITY_HEADERS)
