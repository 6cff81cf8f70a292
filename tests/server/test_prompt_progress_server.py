"""A long prompt through a real server (the demo model, a 64-token prefill budget: the shared
``demo_server``): the engine reports the prompt's progress to the front end, but the OpenAI
stream stays exactly OpenAI's (an opening chunk, one chunk per piece of text, the finish chunk,
the usage chunk; no other chunk, no empty one), while /metrics shows the request running and
the prompt tokens still to read (issue 45, item 1)."""

from __future__ import annotations

import threading

from server_utils import MAX_PREFILL_TOKENS, served_model, wait_until

# ~1,200 tokens: some twenty chunks of the demo server's prefill budget
LONG_MESSAGE = " ".join(
    f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(90)
)


def test_a_long_prompt_streams_only_openai_chunks_and_metrics_show_it_running(demo_server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused", max_retries=0)
    model = served_model(demo_server.url)
    seen: dict[str, float] = {}

    def watch_metrics(done: threading.Event) -> None:
        """The highest figures /metrics shows while the prompt is read."""
        while not done.is_set():
            m = demo_server.metrics()
            for name in ("minisgl_running_requests", "minisgl_prompt_tokens_pending"):
                seen[name] = max(seen.get(name, 0), m.get(name, 0))
            done.wait(0.1)

    done = threading.Event()
    watcher = threading.Thread(target=watch_metrics, args=(done,), daemon=True)
    watcher.start()
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": LONG_MESSAGE}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    finally:
        done.set()
        watcher.join(10)

    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.prompt_tokens > 10 * MAX_PREFILL_TOKENS, "the prompt was meant to take many chunks"
    opening, *texts, finish = chunks[:-1]
    assert opening.choices[0].delta.role == "assistant" and opening.choices[0].delta.content == ""
    assert texts and all(c.choices[0].delta.content for c in texts), "an empty or odd chunk"
    assert all(c.choices[0].finish_reason is None for c in [opening, *texts])
    assert finish.choices[0].finish_reason == "length" and not finish.choices[0].delta.content
    # nothing beyond OpenAI's fields, in any chunk (the client keeps unknown fields as extras)
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk" and not chunk.model_extra
        for choice in chunk.choices:
            assert not choice.model_extra and not choice.delta.model_extra
    assert seen.get("minisgl_running_requests", 0) >= 1
    assert seen.get("minisgl_prompt_tokens_pending", 0) > MAX_PREFILL_TOKENS
    assert wait_until(lambda: demo_server.metrics()["minisgl_prompt_tokens_pending"] == 0, 10)
