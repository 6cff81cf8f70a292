"""The chat page's Content-Security-Policy (app/page/csp.py) on a small ASGI app: every response
of the app it wraps gets it, and a policy of the response's own is kept after it."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from minisgl_app.page.csp import PAGE_CSP, page_csp


def test_every_response_of_the_page_gets_its_image_and_media_policy() -> None:
    """Issue 41, item 6: images and media only from the page's own origin, data: and blob:."""
    assert "img-src 'self' data: blob:" in PAGE_CSP and "media-src 'self' data: blob:" in PAGE_CSP

    async def plain(request):
        return PlainTextResponse("page")

    async def own(request):
        return PlainTextResponse("x", headers={"Content-Security-Policy": "script-src 'self'"})

    app = page_csp(Starlette(routes=[Route("/", plain), Route("/own", own)]))
    with TestClient(app) as client:
        assert client.get("/").headers["content-security-policy"] == PAGE_CSP
        assert client.get("/own").headers.get_list("content-security-policy") == [
            f"{PAGE_CSP}; script-src 'self'"
        ]
        assert client.get("/missing").headers["content-security-policy"] == PAGE_CSP
