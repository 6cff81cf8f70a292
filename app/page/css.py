"""CSS the chat page needs to behave as designed, apart from its look (static/theme.css): what
Gradio draws that the page must not show. It lives in static/page.css, read once here."""

from __future__ import annotations

from importlib.resources import files

# The narrow screen's media query (a phone, a half-screen window): page.css lays the page out by it,
# and the page script's matchMedia asks it (scripts.PAGE_CONFIG). CSS cannot take it from
# elsewhere; tests/unit/test_chat_logic.py checks that page.css's queries are this one and its complement.
NARROW_QUERY = "(max-width: 640px)"

PAGE_CSS = (files("minisgl_app") / "static" / "page.css").read_text(encoding="utf-8")
