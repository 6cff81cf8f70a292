"""The chat page counts a prompt in the front end (LocalEngine.count_prompt_tokens: the model's
tokenizer and chat template, loaded there once) to fit a chat into the context and to show the
meter under the message box: its count must be the server's own, ``usage.prompt_tokens``."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from minisgl_app.chat.reply_source import LocalEngine
from minisgl_engine.weights.demo import DEMO_MODEL_NAME, demo_model_dir

CHATS = {
    "one question": [{"role": "user", "content": "What is the capital of France?"}],
    "system prompt and turns": [
        {"role": "system", "content": "Answer as a pirate."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Ahoy, matey."},
        {"role": "user", "content": "Where is the treasure?"},
    ],
    "code, HTML and blank lines": [
        {
            "role": "user",
            "content": "```python\ndef f(x):\n    return x * 2\n```\n\n<b>bold</b> &amp;",
        },
        {"role": "assistant", "content": "  It doubles x.  \n\n\n"},
        {"role": "user", "content": "And f(3)?"},
    ],
    "CJK and emoji": [
        {"role": "user", "content": "什么是 KV Cache？ 🚀🎉 naïve café"},
        {"role": "assistant", "content": "KV Cache 是……"},
        {"role": "user", "content": "日本語でも？"},
    ],
    "an empty message in a long chat": [
        {"role": "system", "content": "Be brief."},
        *[
            {"role": role, "content": f"turn {i}: " + "the quick brown fox jumps. " * 12}
            for i in range(12)
            for role in ("user", "assistant")
        ],
        {"role": "user", "content": ""},
    ],
}


@pytest.fixture(scope="module")
def counter() -> LocalEngine:
    client = SimpleNamespace(
        tokenizer_path=str(demo_model_dir()), max_context_len=8192, model_name="demo"
    )
    return LocalEngine(client)


@pytest.mark.parametrize("name", list(CHATS))
def test_the_pages_count_is_the_servers_prompt_tokens(demo_server, counter, name):
    messages = CHATS[name]
    r = httpx.post(
        f"{demo_server.url}/v1/chat/completions",
        json={"model": DEMO_MODEL_NAME, "messages": messages, "max_tokens": 1},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    assert counter.count_prompt_tokens(messages, None) == r.json()["usage"]["prompt_tokens"]
