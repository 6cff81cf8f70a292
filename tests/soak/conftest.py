"""Soak suite: real `minisgl-chat serve` processes driven hard (load, abort storms, KV exhaustion,
bad input, faults). `--soak-scale short` (default, CI) keeps it to a few minutes on 2 CPU cores;
`--soak-scale full` is the profile whose figures go into docs/reliability.md. The option itself is
registered in tests/conftest.py."""

from __future__ import annotations

import pytest

from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from server_utils import ServerProcess  # noqa: E402
from soak_utils import MAX_KV_TOKENS, MAX_PREFILL_TOKENS, SCALES, Scale  # noqa: E402


_SERVERS: list[ServerProcess] = []


def _is_soak(item) -> bool:
    return "tests/soak/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("soak/")


def pytest_runtest_teardown(item, nextitem):
    # The soak server is session-scoped (one start for every soak module) but must not idle,
    # holding ~2 GB, through the rest of the suite: stop it once the last soak test has run.
    if _is_soak(item) and (nextitem is None or not _is_soak(nextitem)):
        while _SERVERS:
            _SERVERS.pop().stop()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_soak(item):
            item.add_marker(pytest.mark.soak)


@pytest.fixture(scope="session")
def scale(pytestconfig) -> Scale:
    return SCALES[pytestconfig.getoption("--soak-scale")]


@pytest.fixture(scope="session")
def soak_server(tmp_path_factory):
    """One real server shared by the soak tests (session scope: a start costs ~25 s on 2 cores)."""
    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    srv = ServerProcess("--max-kv-tokens", str(MAX_KV_TOKENS), "--max-prefill-tokens", str(MAX_PREFILL_TOKENS),
                        "--max-running-requests", "64", log_path=tmp_path_factory.mktemp("soak") / "serve.log")
    _SERVERS.append(srv)
    yield srv
    srv.stop()




@pytest.fixture(scope="session")
def greedy_reference(soak_server):
    """``greedy_reference(prompts, max_tokens)`` -> {prompt: non-streamed greedy reply} from the
    soak server (memoised; asked up to 16 at a time)."""
    import asyncio

    import httpx

    from soak_utils import chat_body, complete

    memo: dict[tuple[str, int, bool], str] = {}

    def get(prompts: list[str], max_tokens: int, ignore_eos: bool = False) -> dict[str, str]:
        todo = [p for p in prompts if (p, max_tokens, ignore_eos) not in memo]

        async def main():
            sem = asyncio.Semaphore(16)
            async with httpx.AsyncClient(timeout=600) as client:
                async def one(p):
                    async with sem:
                        body = chat_body(p, max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos)
                        memo[(p, max_tokens, ignore_eos)] = (await complete(client, soak_server.url, body))["choices"][0]["message"]["content"]
                await asyncio.gather(*(one(p) for p in todo))

        if todo:
            asyncio.run(main())
        return {p: memo[(p, max_tokens, ignore_eos)] for p in prompts}

    return get
