"""Web pages in the user's own browser against a real server (docs/security.md): Host and Origin
checks on every route class, the protective headers, no page internals as an API, a DNS-rebinding
simulation against the chat app holding a stored chat, and --allowed-hosts / --allowed-origins."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from chat_page_utils import CHROMIUM, browser  # noqa: F401 (browser: fixture)
from server_utils import CLI, ServerProcess

from minisgl_app.chat.store import ConversationStore
from minisgl_engine.api.security import AccessPolicy, host_name, parse_origin
from minisgl_engine.errors import UserError
from minisgl_engine.weights.demo import DEMO_MODEL_NAME, demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete

needs_demo = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)
SECRET = "my-bank-pin-is-7431"  # the text a rebinding page is after
TITLE = "SECRET-ALPHA private"  # the chat's title: the page's load event answers with it
FOREIGN = "evil.example"
EVIL_ORIGIN = "http://evil.example"
CHAT = {
    "model": DEMO_MODEL_NAME,
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 2,
}
# one route of each class: the page, Gradio's config / API description / named call / queue, OpenAI, metrics, health
ROUTES = [
    ("GET", "/"),
    ("GET", "/config"),
    ("GET", "/gradio_api/info"),
    ("POST", "/gradio_api/call/load_page"),
    ("POST", "/gradio_api/queue/join"),
    ("POST", "/tab-closed"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/metrics"),
    ("GET", "/health"),
]


# ---- the policy on its own --------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, name",
    [
        ("localhost:1919", "localhost"),
        ("LOCALHOST", "localhost"),
        ("[::1]:80", "::1"),
        ("[::1]", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("evil.example.:1919", "evil.example"),
        ("", None),
        (None, None),
        ("[::1", None),
    ],
)
def test_host_name_parses_host_headers(header, name):
    assert host_name(header) == name


def test_loopback_policy_answers_only_loopback_names():
    policy = AccessPolicy.for_bind("127.0.0.1")
    for ok in ("localhost:1919", "127.0.0.1:1919", "[::1]:1919", "localhost", "127.0.0.1:8080"):
        assert policy.allows_host(ok), ok
    for bad in (
        "evil.example:1919",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "0.0.0.0:1919",
        "",
        None,
    ):
        assert not policy.allows_host(bad), bad


def test_lan_policy_adds_bind_address_and_allowed_hosts():
    policy = AccessPolicy.for_bind("192.168.7.20", allowed_hosts=("chat.lan",))
    assert (
        policy.allows_host("192.168.7.20:1919")
        and policy.allows_host("chat.lan:1919")
        and policy.allows_host("localhost")
    )
    assert not policy.allows_host("evil.example:1919")


def test_origin_is_own_only_when_it_names_the_host():
    policy = AccessPolicy.for_bind("127.0.0.1", allowed_origins=("http://localhost:3000/",))
    assert policy.allows_origin("http://localhost:1919", "localhost:1919")
    assert policy.allows_origin("http://[::1]:1919", "[::1]:1919")
    assert policy.allows_origin("http://localhost:3000", "localhost:1919")  # listed
    assert not policy.allows_origin(
        "http://localhost:3001", "localhost:1919"
    )  # another local port is another site
    assert not policy.allows_origin("http://127.0.0.1:1919", "localhost:1919")
    assert not policy.allows_origin("null", "localhost:1919")
    assert not policy.allows_origin(EVIL_ORIGIN, "localhost:1919")


@pytest.mark.parametrize("bad", ["localhost:3000", "ftp://x", "http://x/path", "http://", "*"])
def test_malformed_allowed_origin_is_refused(bad):
    with pytest.raises(UserError, match="--allowed-origins"):
        parse_origin(bad)


def test_cli_refuses_malformed_allowed_origins_with_exit_2():
    r = subprocess.run(
        [*CLI, "serve", "--allowed-origins", "evil.example"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "--allowed-origins" in r.stderr, r.stderr


# ---- a real chat app on loopback --------------------------------------------------------------


@pytest.fixture(scope="module")
def app(chat_app):
    """`minisgl-chat chat` on loopback (conftest.py's, which the browser modules share), its
    database holding a chat with a secret."""
    with ConversationStore(chat_app.data_dir / "chats.sqlite3") as store:
        conv = store.create(title=TITLE)
        store.append(conv.id, "user", f"Remember this: {SECRET}")
        store.append(conv.id, "assistant", f"I will remember {SECRET}.")
    return chat_app


def call(
    srv: ServerProcess,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    logged_in: bool = False,
    **kw,
) -> httpx.Response:
    """One request; ``logged_in``: with the cookie the page's link gives a browser."""
    if method == "POST" and "json" not in kw:
        kw["json"] = (
            CHAT if path.startswith("/v1/") else {"data": [], "fn_index": 0, "session_hash": "abc"}
        )
    cookies = srv.page_cookies if logged_in else None
    return httpx.request(
        method, f"{srv.url}{path}", headers=headers, cookies=cookies, timeout=30, **kw
    )


@needs_demo
@pytest.mark.parametrize("method, path", ROUTES)
def test_foreign_host_is_refused_on_every_route(app, method, path):
    r = call(app, method, path, {"Host": f"{FOREIGN}:{app.port}"})
    assert r.status_code == 403, (path, r.status_code, r.text[:200])
    error = r.json()["error"]
    assert error["code"] == "host_not_allowed" and "--allowed-hosts" in error["message"]
    assert SECRET not in r.text


@needs_demo
@pytest.mark.parametrize(
    "host", ["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}", "localhost"]
)
def test_loopback_names_are_served(app, host):
    for path in ("/", "/config", "/v1/models", "/metrics", "/health"):
        r = call(app, "GET", path, {"Host": host.format(port=app.port)}, logged_in=True)
        assert r.status_code == 200, (host, path, r.status_code)
    r = call(app, "POST", "/v1/chat/completions", {"Host": host.format(port=app.port)})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


@needs_demo
def test_refusals_are_logged_without_bodies(app):
    call(
        app,
        "POST",
        "/v1/chat/completions",
        {"Host": f"{FOREIGN}:{app.port}"},
        json={**CHAT, "messages": [{"role": "user", "content": "body-marker-5521"}]},
    )
    log = app.output()
    assert "refused POST /v1/chat/completions (403)" in log
    assert "body-marker-5521" not in log


@needs_demo
@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/chat/completions"),
        ("POST", "/gradio_api/queue/join"),
        ("POST", "/gradio_api/upload"),
        ("POST", "/tab-closed"),
    ],
)
def test_foreign_origin_cannot_change_state(app, method, path):
    for origin in (EVIL_ORIGIN, "http://localhost:3000", "null"):
        r = call(app, method, path, {"Origin": origin})
        assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed", (
            origin,
            r.text[:200],
        )


@needs_demo
def test_own_origin_and_no_origin_are_served(app):
    assert call(app, "POST", "/v1/chat/completions", {"Origin": app.url}).status_code == 200
    assert call(app, "POST", "/v1/chat/completions").status_code == 200  # curl, the openai client


@needs_demo
def test_foreign_origin_gets_no_cors_headers(app):
    r = call(app, "GET", "/v1/models", {"Origin": "http://localhost:3000"})
    assert "access-control-allow-origin" not in r.headers
    r = call(
        app, "GET", "/config", {"Origin": "http://localhost:3000"}, logged_in=True
    )  # Gradio's own CORS would allow localhost
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers


@needs_demo
@pytest.mark.parametrize("path", ["/", "/v1/models", "/gradio_api/info", "/health"])
def test_protective_headers(app, path):
    r = call(app, "GET", path)
    assert r.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"


@needs_demo
def test_page_events_are_not_an_api(app):
    """Not even for the page's own user (logged in)."""
    info = call(app, "GET", "/gradio_api/info", logged_in=True).json()
    assert info["named_endpoints"] == {} and info["unnamed_endpoints"] == {}
    for name in ("load_page", "show_conversation", "respond", "delete"):
        r = call(app, "POST", f"/gradio_api/call/{name}", json={"data": []}, logged_in=True)
        assert r.status_code == 404 and SECRET not in r.text, name
    assert (
        call(
            app, "POST", "/gradio_api/run/load_page", json={"data": []}, logged_in=True
        ).status_code
        == 404
    )
    r = call(
        app, "POST", "/gradio_api/run/predict", json={"data": []}, logged_in=True
    )  # the page names events by index only
    assert r.status_code != 200 and SECRET not in r.text


@needs_demo
def test_dns_rebinding_simulation_reads_no_chat(app):
    """What the rebinding page did before the fix: the named call, then its event stream; and the
    page's own way in (queue/join + queue/data) with every event index."""
    rebound = {"Host": f"{FOREIGN}:{app.port}"}
    r = call(app, "POST", "/gradio_api/call/load_page", rebound, json={"data": []})
    assert r.status_code == 403
    r = call(app, "GET", "/gradio_api/call/load_page/0123456789", rebound)
    assert r.status_code == 403 and SECRET not in r.text
    for fn_index in range(12):
        body = {"data": [], "fn_index": fn_index, "session_hash": "rebind0001", "trigger_id": None}
        for path in ("/gradio_api/queue/join", "/gradio_api/run/predict"):
            r = call(app, "POST", path, rebound, json=body)
            assert r.status_code == 403 and SECRET not in r.text
    r = call(app, "GET", "/gradio_api/queue/data?session_hash=rebind0001", rebound)
    assert r.status_code == 403 and SECRET not in r.text


# ---- the page is its user's: the page key ----------------------------------------------------

# What another local user did before the page key (issue 41): no cookie, a made-up session, the
# page's load event called by index through the queue, its answer read from the event stream.
# Standard library only: it also runs as `nobody` under the system's Python.
PROBE = r"""
import json, sys, urllib.request, urllib.error
url, key_file, cookie = sys.argv[1], sys.argv[2], (sys.argv[3] if len(sys.argv) > 3 else "")
out = {}
try:
    open(key_file).read()
    out["key_file"] = "read"
except OSError as exc:
    out["key_file"] = type(exc).__name__
def get(path, body=None):
    req = urllib.request.Request(url + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Cookie": cookie})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
status, text = get("/config")
out["config"] = status
load, inputs = 0, 0
if status == 200:
    dep = next(d for d in json.loads(text)["dependencies"] if any(t[1] == "load" for t in d["targets"]))
    load, inputs = dep["id"], len(dep["inputs"])
out["join"], _ = get("/gradio_api/queue/join", {"data": [None] * inputs, "fn_index": load, "session_hash": "probe0001",
                                                "trigger_id": None, "event_data": None})
out["data"], out["stream"] = get("/gradio_api/queue/data?session_hash=probe0001")
print(json.dumps(out))
"""


def probe(app, python: list[str], cookie: str = "") -> tuple[dict, str]:
    """Run PROBE with ``python`` (a command prefix); (its findings, everything it printed)."""
    r = subprocess.run(
        [*python, "-c", PROBE, app.url, str(app.data_dir / "page-key"), cookie],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stdout


@needs_demo
def test_the_pages_events_need_the_page_key(app):
    """The probe reads the secret chat with the browser's cookie (so it can fail), and without it
    gets 401 at every step, as does every other page route, with any made-up cookie too."""
    [(name, key)] = app.page_cookies.items()
    found, printed = probe(app, [sys.executable], f"{name}={key}")
    assert found["config"] == 200 and found["join"] == 200 and TITLE in printed, found
    for cookie in ("", f"{name}=wrong-key", f"minisgl-page-1={key}x"):
        found, printed = probe(app, [sys.executable], cookie)
        assert (found["config"], found["join"], found["data"]) == (
            401,
            401,
            401,
        ) and TITLE not in printed, (cookie, found)
    for method, path in [
        ("GET", "/"),
        ("GET", "/gradio_api/info"),
        ("POST", "/gradio_api/upload"),
        ("POST", "/tab-closed"),
        ("GET", f"/gradio_api/file={app.data_dir / 'chats.sqlite3'}"),
        ("GET", "/theme.css"),
    ]:
        r = call(app, method, path)
        assert r.status_code == 401 and SECRET not in r.text, (path, r.status_code)
    assert (
        call(app, "GET", "/", {"Accept": "text/html"}).text.count('name="key"') == 1
    )  # a browser gets the login form
    for path in (
        "/v1/models",
        "/metrics",
        "/health",
    ):  # not the page's: open on loopback, as before
        assert call(app, "GET", path).status_code == 200, path


@needs_demo
def test_the_pages_link_logs_in_with_a_private_cookie_and_leaves_the_address(app):
    link = app.page_url
    assert link.startswith(f"{app.url}/?token=")
    lines = app.log_path.read_text().splitlines()
    ready_at = max(i for i, line in enumerate(lines) if line.startswith("minisgl-chat: ready at "))
    assert lines[ready_at + 1] == f"minisgl-chat: the chat is ready: open {link} in your browser", (
        lines[ready_at:]
    )  # read last
    r = httpx.get(link.replace("?", "?chat=7&"), timeout=30)
    assert r.status_code == 303 and r.headers["location"] == "/?chat=7", (r.status_code, r.headers)
    cookie = r.headers["set-cookie"]
    name, key = next(iter(app.page_cookies.items()))
    assert (
        cookie.startswith(f"{name}={key};") and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    ), cookie
    assert (
        httpx.get(
            f"{app.url}/", cookies=dict([cookie.split(";")[0].split("=", 1)]), timeout=30
        ).status_code
        == 200
    )
    assert httpx.get(f"{app.url}/?token=not-the-key", timeout=30).status_code == 401
    assert (app.data_dir / "page-key").stat().st_mode & 0o777 == 0o600


@needs_demo
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None or not Path("/usr/bin/python3").exists(),
    reason="needs root (runuser) to act as another local user, and the system's python3",
)
def test_another_local_user_can_neither_read_the_page_key_nor_reach_the_chats(app):
    """As the OS user `nobody` (the issue's probe): the key file is unreadable, every step of the
    probe is 401, and nothing of the chat comes back."""
    found, printed = probe(app, ["runuser", "-u", "nobody", "--", "/usr/bin/python3"])
    assert found["key_file"] == "PermissionError", found
    assert (found["config"], found["join"], found["data"]) == (
        401,
        401,
        401,
    ) and TITLE not in printed, found


# ---- a LAN bind with allowed hosts and origins ------------------------------------------------


@pytest.fixture(scope="module")
def lan_server(tmp_path_factory):
    """The chat app bound for the LAN: an API key, one more host name and one more origin (the
    app, not `serve`: the login wall of the page is tested here too, without another start)."""
    folder = tmp_path_factory.mktemp("lan")
    srv = ServerProcess(
        "--no-browser",
        "--host",
        "0.0.0.0",
        "--api-key",
        "k3y",
        "--allowed-hosts",
        "chat.lan",
        "--allowed-origins",
        EVIL_ORIGIN,
        "--max-kv-tokens",
        "4096",
        command="chat",
        log_path=folder / "app.log",
        env={"MINISGL_DATA_DIR": str(folder / "data")},
    )
    yield srv
    srv.stop()


@needs_demo
def test_allowed_hosts_extend_the_names(lan_server):
    key = {"Authorization": "Bearer k3y"}
    assert (
        call(
            lan_server, "GET", "/v1/models", {**key, "Host": f"chat.lan:{lan_server.port}"}
        ).status_code
        == 200
    )
    assert (
        call(
            lan_server, "GET", "/v1/models", {**key, "Host": f"localhost:{lan_server.port}"}
        ).status_code
        == 200
    )
    assert (
        call(
            lan_server, "GET", "/v1/models", {**key, "Host": f"{FOREIGN}:{lan_server.port}"}
        ).status_code
        == 403
    )


@needs_demo
def test_allowed_origin_gets_cors_for_itself_only(lan_server):
    key = {"Authorization": "Bearer k3y"}
    preflight = call(
        lan_server,
        "OPTIONS",
        "/v1/chat/completions",
        {
            "Origin": EVIL_ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == EVIL_ORIGIN
    r = call(lan_server, "POST", "/v1/chat/completions", {**key, "Origin": EVIL_ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == EVIL_ORIGIN
    other = call(
        lan_server, "POST", "/v1/chat/completions", {**key, "Origin": "http://other.example"}
    )
    assert other.status_code == 403 and "access-control-allow-origin" not in other.headers
    assert (
        call(lan_server, "POST", "/v1/chat/completions", {"Origin": EVIL_ORIGIN}).status_code == 401
    )  # the key still counts


@pytest.mark.browser
@pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="Debian's chromium is not installed (apt-get install chromium)",
)
@needs_demo
def test_someone_on_the_lan_logs_in_with_the_api_key(browser, lan_server):
    """Off loopback the page's link is in the terminal of the machine that runs it; a browser on
    the LAN gets the login form, which takes the API key (a wrong one shows nothing of the chats)."""
    page = browser.new_page()
    page.goto(f"{lan_server.url}/?chat=1")
    page.wait_for_selector("input[type=password]", timeout=30_000)
    assert page.locator("#msg-input").count() == 0 and "terminal" in page.inner_text("body")
    page.fill("input[type=password]", "wrong")
    page.click("button:has-text('Open')")
    page.wait_for_selector("text=That key is not right", timeout=10_000)
    assert page.locator("#msg-input").count() == 0
    page.fill("input[type=password]", "k3y")
    redirects = []
    page.on("response", lambda r: r.status == 303 and redirects.append(r.headers.get("location")))
    page.click("button:has-text('Open')")
    page.wait_for_selector("#msg-input textarea", timeout=30_000)
    assert redirects == ["/?chat=1"], redirects  # back where the person was going
    page.close()


def test_no_auth_is_refused_off_loopback_with_exit_2():
    r = subprocess.run(
        [*CLI, "chat", "--no-browser", "--no-auth", "--host", "0.0.0.0", "--api-key", "k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "--no-auth" in r.stderr, (
        r.stderr
    )


def test_the_browser_is_opened_logged_in_without_the_key_on_its_command_line(tmp_path):
    """What `make run` and the desktop launcher do: the app opens the browser ($BROWSER here, a
    script that notes its arguments) on a private file that leads to the page's link, so the key
    is in no process's command line (every user can read those through /proc). The remote mode
    opens it the same way and starts without an engine."""
    seen, script = tmp_path / "browser-args", tmp_path / "browser"
    script.write_text(f'#!/bin/sh\nprintf "%s" "$*" > {seen}\n')
    script.chmod(0o755)
    data = tmp_path / "data"
    srv = ServerProcess(
        "--remote",
        "http://127.0.0.1:9",
        command="chat",
        log_path=tmp_path / "app.log",
        env={"BROWSER": str(script), "MINISGL_DATA_DIR": str(data)},
    )
    try:
        from server_utils import wait_until

        assert wait_until(seen.exists, 30), srv.output()
        opened, key = seen.read_text(), (data / "page-key").read_text().strip()
        assert opened.startswith("file://") and key not in opened, opened
        redirect = Path(opened.removeprefix("file://"))
        assert redirect.stat().st_mode & 0o777 == 0o600 and srv.page_url in redirect.read_text()
        assert srv.page_url.endswith(f"/?token={key}")
        assert httpx.get(srv.page_url, timeout=30).status_code == 303  # the link logs in
    finally:
        srv.stop()
