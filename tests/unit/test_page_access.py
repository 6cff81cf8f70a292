"""The page key (app/page/access.py) on its own: the guard around the page's routes, the key's
file, the redirect file the browser is opened on. The real app behind it: test_web_security.py."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from minisgl_app.page.access import (
    LOGIN_PATH,
    MAX_FAILED_LOGINS,
    PAGE_KEY_FILE,
    FailedLogins,
    PageGuard,
    load_page_key,
    page_link,
    safe_next,
    write_open_file,
)

KEY = "k" * 43


def page_behind_guard(api_key: str | None = None) -> TestClient:
    async def page(request):
        return PlainTextResponse(f"the page at {request.url.path}")

    inner = Starlette(routes=[Route("/{path:path}", page, methods=["GET", "POST"])])
    return TestClient(
        PageGuard(inner, KEY, api_key), base_url="http://127.0.0.1:1919", follow_redirects=False
    )


def test_without_the_key_every_route_is_401():
    client = page_behind_guard()
    for method, path in [
        ("GET", "/"),
        ("GET", "/config"),
        ("POST", "/gradio_api/queue/join"),
        ("GET", "/gradio_api/file=/etc/passwd"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 401 and r.json()["error"]["code"] == "page_key_required", (
            path,
            r.text,
        )
    r = client.get("/?chat=5", headers={"Accept": "text/html"})
    assert r.status_code == 401 and 'action="/page-login"' in r.text and "the page at" not in r.text
    assert 'name="next" value="/?chat=5"' in r.text  # where the login goes back to
    client.cookies.set("minisgl-page-1919", KEY + "x")
    assert client.get("/").status_code == 401


def test_the_link_sets_the_cookie_named_after_the_port_and_drops_the_key_from_the_address():
    client = page_behind_guard()
    r = client.get(f"/?chat=3&token={KEY}")
    assert r.status_code == 303 and r.headers["location"] == "/?chat=3"
    assert (
        r.headers["set-cookie"].startswith(f"minisgl-page-1919={KEY};")
        and "HttpOnly" in r.headers["set-cookie"]
    )
    assert client.get("/config").text == "the page at /config"  # the client keeps the cookie
    other_port = TestClient(client.app, base_url="http://127.0.0.1:1920", follow_redirects=False)
    other_port.cookies.set("minisgl-page-1919", KEY)
    assert other_port.get("/config").status_code == 401  # another server's cookie


def test_the_login_form_takes_the_page_key_or_the_api_key_and_goes_back_where_asked():
    client = page_behind_guard(api_key="lan-key")
    r = client.post(
        LOGIN_PATH, data={"key": "nope", "next": "/?chat=2"}, headers={"Accept": "text/html"}
    )
    assert (
        r.status_code == 401 and "That key is not right" in r.text and 'value="/?chat=2"' in r.text
    )
    r = client.post(LOGIN_PATH, data={"key": "lan-key", "next": "/?chat=2"})
    assert r.status_code == 303 and r.headers["location"] == "/?chat=2"
    assert client.get("/").status_code == 200
    fresh = page_behind_guard(api_key=None)
    assert (
        fresh.post(LOGIN_PATH, data={"key": "lan-key"}).status_code == 401
    )  # no API key: only the page key
    assert (
        fresh.post(LOGIN_PATH, data={"key": KEY, "next": "https://evil.example/"}).headers[
            "location"
        ]
        == "/"
    )


@pytest.mark.parametrize(
    "where, safe",
    [
        ("/", "/"),
        ("/?chat=4", "/?chat=4"),
        ("//evil.example/", "/"),
        ("https://x/", "/"),
        ("/\\evil.example", "/"),
        (f"{LOGIN_PATH}", "/"),
        ("", "/"),
    ],
)
def test_safe_next_stays_on_this_server(where, safe):
    assert safe_next(where) == safe


def test_wrong_keys_lock_the_api_key_out_for_a_while_but_never_the_page_key():
    """A person's API key may be guessable: after MAX_FAILED_LOGINS wrong keys in the window, no key
    but the page key is even checked (429, the form for a browser). The page key (256 random bits)
    still opens the page, by the link or the form: whoever tries keys cannot lock its owner out."""
    client = page_behind_guard(api_key="lan-key")
    for _ in range(MAX_FAILED_LOGINS):
        assert client.post(LOGIN_PATH, data={"key": "guess"}).status_code == 401
    r = client.post(LOGIN_PATH, data={"key": "lan-key"})
    assert (
        r.status_code == 429
        and int(r.headers["retry-after"]) >= 1
        and r.json()["error"]["code"] == "too_many_logins"
    )
    r = client.post(
        LOGIN_PATH, data={"key": "guess", "next": "/?chat=2"}, headers={"Accept": "text/html"}
    )
    assert (
        r.status_code == 429 and "Too many wrong keys" in r.text and 'value="/?chat=2"' in r.text
    )  # the form, for a browser
    r = client.get("/?chat=2&token=wrong", headers={"Accept": "text/html"})
    assert (
        r.status_code == 429 and "token" not in r.text.split("<form")[1]
    )  # the next address drops the key given
    assert client.get(f"/?token={KEY}").status_code == 303  # the owner's link
    same_guard = TestClient(
        client.app, base_url="http://127.0.0.1:1919", follow_redirects=False
    )  # no cookie
    assert (
        same_guard.post(LOGIN_PATH, data={"key": KEY}).status_code == 303
    )  # the form takes it too
    assert (
        TestClient(client.app, base_url="http://127.0.0.1:1919")
        .post(LOGIN_PATH, data={"key": "lan-key"})
        .status_code
        == 429
    )
    limiter = FailedLogins(
        limit=2, window_s=0.0
    )  # a window that has passed lets keys be tried again
    limiter.add()
    limiter.add()
    assert limiter.wait_s() == 0.0


def test_a_browser_already_logged_in_is_not_limited():
    client = page_behind_guard()
    client.get(f"/?token={KEY}")
    for _ in range(MAX_FAILED_LOGINS + 1):
        client.app.failed.add()
    assert client.get("/").status_code == 200


def test_websockets_without_the_key_are_closed():
    from starlette.websockets import WebSocketDisconnect

    client = page_behind_guard()
    with pytest.raises(WebSocketDisconnect) as closed:
        with client.websocket_connect("/ws"):
            pass
    assert closed.value.code == 1008


def test_the_key_is_made_once_privately_and_kept(tmp_path):
    key = load_page_key(tmp_path)
    path = tmp_path / PAGE_KEY_FILE
    assert len(key) >= 32 and path.stat().st_mode & 0o777 == 0o600
    assert load_page_key(tmp_path) == key
    path.chmod(0o644)
    assert (
        load_page_key(tmp_path) == key and path.stat().st_mode & 0o777 == 0o600
    )  # a looser mode is tightened
    path.write_text("short\n")
    assert load_page_key(tmp_path) not in (key, "short")  # a damaged key is replaced


def test_the_browser_is_opened_on_a_private_file_that_holds_the_link(tmp_path):
    link = page_link("http://127.0.0.1:1919", KEY)
    assert (
        link == f"http://127.0.0.1:1919/?token={KEY}"
        and page_link("http://127.0.0.1:1919", None) == "http://127.0.0.1:1919/"
    )
    path = write_open_file(tmp_path, link)
    assert path.stat().st_mode & 0o777 == 0o600
    assert f'url={link}"' in path.read_text() and f'href="{link}"' in path.read_text()
