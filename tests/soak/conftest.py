"""Soak suite: real `minisgl-chat serve` processes driven hard (load, abort storms, KV exhaustion,
bad input, faults). `--soak-scale short` (default, CI) keeps it to a few minutes on 2 CPU cores;
`--soak-scale full` is the profile whose figures go into docs/reliability.md. The option itself is
registered in tests/conftest.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from soak_utils import SCALES, Scale  # noqa: E402


def _is_soak(item) -> bool:
    return "tests/soak/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("soak/")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_soak(item):
            item.add_marker(pytest.mark.soak)


@pytest.fixture(scope="session")
def scale(pytestconfig) -> Scale:
    return SCALES[pytestconfig.getoption("--soak-scale")]


@pytest.fixture(scope="session")
def soak_server(demo_server):
    """The session's demo server (tests/conftest.py): its small prefill budget and 64 running
    requests are what the soak tests need, and one start fewer saves ~20 s of CI."""
    return demo_server


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
                        body = chat_body(
                            p, max_tokens=max_tokens, temperature=0, ignore_eos=ignore_eos
                        )
                        memo[(p, max_tokens, ignore_eos)] = (
                            await complete(client, soak_server.url, body)
                        )["choices"][0]["message"]["content"]

                await asyncio.gather(*(one(p) for p in todo))

        if todo:
            asyncio.run(main())
        return {p: memo[(p, max_tokens, ignore_eos)] for p in prompts}

    return get
