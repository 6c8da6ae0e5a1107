"""The API's own description: GET /openapi.json and its two viewers, GET /docs (Swagger UI) and GET /redoc.

With auth on they need an API key like every route but /health, /ready and the chat page
(docs/decisions/0039-open-and-guarded-routes.md): the schema maps every route and parameter,
and the viewers only render it. A browser sends no key by itself, so with auth on the schema is
read with one (`curl -H "Authorization: Bearer $KEY" .../openapi.json`); with auth off all three
are open, as FastAPI serves them by default.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from api.auth import AuthorizedCaller

OPENAPI_URL = "/openapi.json"

router = APIRouter(include_in_schema=False)


@router.get(OPENAPI_URL)
async def openapi(request: Request, _: AuthorizedCaller) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request, _: AuthorizedCaller) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - Swagger UI")


@router.get("/redoc")
async def redoc(request: Request, _: AuthorizedCaller) -> HTMLResponse:
    return get_redoc_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - ReDoc")
