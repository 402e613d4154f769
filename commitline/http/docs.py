"""The API's interactive documentation, served entirely by this server: Swagger UI at ``/docs`` and ReDoc at
``/redoc`` over ``/openapi.json``, their scripts and styles from an installed package (``fastapi-offline``'s
bundles) at ``/docs/static/...``, never from a CDN, so the pages work on a machine without internet."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse, Response

from commitline.http.problems import RouteNotFound

router = APIRouter(include_in_schema=False)
_ASSETS = resources.files("fastapi_offline") / "static"
_MEDIA = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8",
          "redoc.standalone.js": "text/javascript; charset=utf-8", "favicon.png": "image/png"}
STATIC = "/docs/static"


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title}: API",
                               swagger_js_url=f"{STATIC}/swagger-ui-bundle.js",
                               swagger_css_url=f"{STATIC}/swagger-ui.css", swagger_favicon_url=f"{STATIC}/favicon.png")


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title}: API",
                          redoc_js_url=f"{STATIC}/redoc.standalone.js", redoc_favicon_url=f"{STATIC}/favicon.png",
                          with_google_fonts=False)


@router.get(STATIC + "/{name}")
def asset(name: str, request: Request) -> Response:
    if name not in _MEDIA:
        raise RouteNotFound(request.url.path)
    return Response((_ASSETS / name).read_bytes(), media_type=_MEDIA[name],
                    headers={"Cache-Control": "public, max-age=86400"})
