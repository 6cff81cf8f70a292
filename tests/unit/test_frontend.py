"""FrontendClient against a stand-in tokenizer over real ZeroMQ sockets: what the chat's Stop
relies on (a stopped request ends at once and is aborted in the engine, before any reply came)."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from minisgl_engine.messages import (
    AbortMsg,
    FrontendBatch,
    TokenizeMsg,
    TokenizerBatch,
    UserReply,
    decoder,
    encode,
)
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.workers.frontend import FrontendClient, GenerateRequest
from minisgl_engine.workers.ipc import SocketPaths, make_runtime_dir, remove_runtime_dir


@pytest.fixture
def wired():
    """(client, tokenizer socket, socket to the client's receiver) in a private runtime folder."""
    folder = make_runtime_dir()
    paths = SocketPaths(str(folder), 1)
    ctx = zmq.Context()
    tokenizer = ctx.socket(zmq.PULL)
    tokenizer.bind(paths.tokenizer(0))
    to_frontend = ctx.socket(zmq.PUSH)
    client = FrontendClient(paths, "m", [])
    to_frontend.connect(paths.frontend)
    yield client, tokenizer, to_frontend
    client.close()
    tokenizer.close(0)
    to_frontend.close(0)
    ctx.term()
    remove_runtime_dir(folder)


def received(tokenizer: zmq.Socket) -> list:
    assert tokenizer.poll(5000), "nothing reached the tokenizer"
    return decoder(TokenizerBatch).decode(tokenizer.recv()).msgs


def request() -> GenerateRequest:
    return GenerateRequest(params=SamplingParams(max_tokens=8), text="hello")


def test_stop_ends_a_request_that_has_no_reply_yet_and_aborts_it(wired):
    client, tokenizer, _ = wired

    async def scenario() -> list[UserReply]:
        client.start()
        stop = asyncio.Event()
        got: list[UserReply] = []

        async def consume() -> None:
            async for reply in client.generate(request(), stop):
                got.append(reply)

        task = asyncio.create_task(consume())
        [msg] = await asyncio.to_thread(received, tokenizer)
        assert isinstance(msg, TokenizeMsg) and client.pending_count == 1
        stop.set()  # mid prefill: no reply has come, none will before the stop
        await asyncio.wait_for(task, 5)
        [abort] = await asyncio.to_thread(received, tokenizer)
        assert abort == AbortMsg(msg.uid)
        return got

    assert asyncio.run(scenario()) == []
    assert client.pending_count == 0


def test_stop_after_some_replies_keeps_them_and_a_finished_request_is_not_aborted(wired):
    client, tokenizer, to_frontend = wired

    async def scenario() -> None:
        client.start()
        stop = asyncio.Event()
        stream = client.generate(request(), stop)
        first = asyncio.ensure_future(stream.__anext__())
        [msg] = await asyncio.to_thread(received, tokenizer)
        to_frontend.send(encode(FrontendBatch([UserReply(msg.uid, "Hel", completion_tokens=1)])))
        assert (await asyncio.wait_for(first, 5)).incremental_output == "Hel"
        stop.set()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(stream.__anext__(), 5)
        assert (await asyncio.to_thread(received, tokenizer)) == [AbortMsg(msg.uid)]

        # without a stop, a request that finishes is not aborted
        replies = client.generate(request(), asyncio.Event())
        first = asyncio.ensure_future(replies.__anext__())
        [msg] = await asyncio.to_thread(received, tokenizer)
        to_frontend.send(
            encode(
                FrontendBatch(
                    [
                        UserReply(
                            msg.uid, "Hi", completion_tokens=1, finished=True, finish_reason="stop"
                        )
                    ]
                )
            )
        )
        assert (await asyncio.wait_for(first, 5)).finished
        with pytest.raises(StopAsyncIteration):
            await replies.__anext__()
        assert not tokenizer.poll(300), "a finished request was aborted"

    asyncio.run(scenario())
    assert client.pending_count == 0
