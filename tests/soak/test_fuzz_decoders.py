"""Bad input on the IPC channels: every message decoder, fed random bytes, random MessagePack
structures, near-valid batches with random field values, and a pickle payload, fails only with
msgspec's decode/validation error (or SamplingParams' own RequestError, its field check) — never
anything else, never unpickles; and a live Receiver logs and drops such input and keeps going."""

from __future__ import annotations

import logging
import pickle

import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minisgl_engine.errors import RequestError
from minisgl_engine.messages import (
    BATCH_TYPES,
    AbortMsg,
    BackendBatch,
    FrontendBatch,
    TokenizeMsg,
    TokenizerBatch,
    UserMsg,
    decoder,
    encode,
)
from minisgl_engine.sampling_params import SamplingParams
from minisgl_engine.workers.ipc import Receiver

ALLOWED = (msgspec.DecodeError, RequestError)  # msgspec.ValidationError is a DecodeError

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(),
    st.text(max_size=20),
    st.binary(max_size=20),
)
structures = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
TAGS = [
    "TokenizeMsg",
    "AbortMsg",
    "UserMsg",
    "AbortBackendMsg",
    "DetokenizeMsg",
    "UserReply",
    "StatsMsg",
    "ReadyMsg",
    "Nope",
]
FIELDS = [
    "uid",
    "params",
    "text",
    "messages",
    "input_ids",
    "next_token",
    "finished",
    "finish_reason",
    "error",
    "incremental_output",
    "running",
    "worker",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
]
near_valid = st.builds(
    lambda msgs: {"msgs": msgs},
    st.lists(
        st.builds(
            lambda tag, fields: {"type": tag, **fields},
            st.sampled_from(TAGS),
            st.dictionaries(
                st.sampled_from(FIELDS),
                st.one_of(structures, st.dictionaries(st.sampled_from(FIELDS), scalars)),
                max_size=8,
            ),
        ),
        max_size=4,
    ),
)


def check(batch_type, raw: bytes) -> None:
    try:
        decoder(batch_type).decode(raw)
    except ALLOWED:
        pass


def fuzz_settings(request):
    n = request.config.getoption("--soak-scale") == "full" and 2000 or 100
    return settings(
        max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
    )


@pytest.mark.parametrize("batch_type", BATCH_TYPES, ids=lambda t: t.__name__)
def test_random_bytes(batch_type, request):
    @fuzz_settings(request)
    @given(st.binary(max_size=256))
    def run(raw):
        check(batch_type, raw)

    run()


@pytest.mark.parametrize("batch_type", BATCH_TYPES, ids=lambda t: t.__name__)
def test_random_msgpack_structures(batch_type, request):
    @fuzz_settings(request)
    @given(st.one_of(structures, near_valid))
    def run(value):
        check(batch_type, msgspec.msgpack.encode(value))

    run()


@pytest.mark.parametrize("batch_type", BATCH_TYPES, ids=lambda t: t.__name__)
def test_pickle_payload_is_rejected(batch_type):
    class Boom:
        def __reduce__(self):
            return (pytest.fail, ("a decoder unpickled its input",))

    for payload in (
        pickle.dumps(Boom()),
        pickle.dumps(TokenizerBatch(msgs=[AbortMsg(uid=1)])),
        pickle.dumps({"msgs": []}),
    ):
        with pytest.raises(msgspec.DecodeError):
            decoder(batch_type).decode(payload)


def test_valid_batches_round_trip():
    b = TokenizerBatch(
        msgs=[TokenizeMsg(uid=3, params=SamplingParams(max_tokens=4), text="hi"), AbortMsg(uid=4)]
    )
    assert decoder(TokenizerBatch).decode(encode(b)) == b
    bb = BackendBatch(msgs=[UserMsg(uid=3, input_ids=[1, 2], params=SamplingParams())])
    assert decoder(BackendBatch).decode(encode(bb)) == bb
    with pytest.raises(msgspec.DecodeError):  # a batch of another channel
        decoder(FrontendBatch).decode(encode(b))


def test_live_receiver_logs_and_drops_garbage_then_keeps_working(tmp_path, caplog):
    ctx = zmq.Context()
    addr = f"ipc://{tmp_path}/fuzz.sock"
    rx = Receiver(ctx, addr, TokenizerBatch)
    tx = ctx.socket(zmq.PUSH)
    tx.connect(addr)
    good = TokenizerBatch(msgs=[AbortMsg(uid=7)])
    try:
        with caplog.at_level(logging.WARNING):
            for raw in (
                b"\x00\xff garbage",
                pickle.dumps(good),
                msgspec.msgpack.encode({"msgs": [{"type": "AbortMsg"}]}),
                msgspec.msgpack.encode(
                    {"msgs": [{"type": "TokenizeMsg", "uid": 1, "params": {"max_tokens": 0}}]}
                ),
                encode(good),
            ):
                tx.send(raw)
            got = []
            for _ in range(50):
                got += rx.recv_all(block=True, timeout_ms=100)
                if got:
                    break
        assert got == [good]
        assert sum("dropped an invalid message" in r.getMessage() for r in caplog.records) == 4
    finally:
        tx.close(0)
        rx.socket.close(0)
        ctx.term()
