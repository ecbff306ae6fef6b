"""The playground: one static page (api/server/static/playground.html, shipped in the wheel) at
GET / and /playground. It calls the API from the browser on the same origin, so it needs
no CDN, no CORS and no server-side state; with auth on, the key is typed into the page."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

from openjev.api.operations.page_headers import DOCS_POLICY, page_policy

PAGE = "playground.html"
PATHS = ("/", "/playground")
DOCS_PAGES = ("/docs", "/docs/oauth2-redirect", "/redoc")


def page() -> str:
    return resources.files("openjev.api.server").joinpath("static", PAGE).read_text(encoding="utf-8")


def install(app: FastAPI) -> None:
    html = page()  # read once: a missing asset fails at startup, not on the first visit

    async def playground() -> HTMLResponse:
        # no-store: a page from an older server version must not outlive an upgrade
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})

    for path in PATHS:
        app.add_api_route(path, playground, methods=["GET"], include_in_schema=False)


def page_policies(docs: bool) -> dict[str, str]:
    """The Content-Security-Policy of each page a browser renders (api/operations/page_headers.py):
    the playground's allows its own inline script by hash; the docs' where they are served."""
    policy = page_policy(page())
    return {**dict.fromkeys(PATHS, policy), **(dict.fromkeys(DOCS_PAGES, DOCS_POLICY) if docs else {})}
