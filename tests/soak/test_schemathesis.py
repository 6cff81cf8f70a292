"""Property-based API fuzzing with schemathesis against the real server's /openapi.json, /v1/*
only: generated requests (valid and invalid, at least 500 in all) never get a 5xx, and every
error is in OpenAI's shape ({"error": {"message": str, "type": str, ...}}).

Generated bodies may ask for up to a million tokens; to bound CPU time a generated integer
``max_tokens`` / ``max_completion_tokens`` above 2 is lowered to 2, and a JSON-object body with
neither field (or only nulls) gets ``max_tokens: 2`` (without it a reply may run to the end of the 8192-token
context: one such request took over 120 s on 2 cores; two tokens take a reply through the
decode path and its stop and length checks). A generated ``model`` string becomes the served
model's name (any other is a 404 that leaves the rest of a valid body untried). Other values are sent
as generated."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from server_utils import served_model

schemathesis = pytest.importorskip("schemathesis")

COUNTS: dict[str, int] = {}
MIN_TOTAL = 500


def test_generated_v1_requests_never_5xx_and_errors_are_openai_shaped(soak_server, scale):
    url = soak_server.url
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.path.startswith("/v1/")]
    assert {op.path for op in ops} >= {"/v1/chat/completions", "/v1/completions", "/v1/models"}
    # GET /v1/models takes no input (one request); the two POST routes share the rest
    per_op = (MIN_TOTAL if scale.name == "short" else 4 * MIN_TOTAL) // 2 + 20
    model = served_model(url)

    def send(item) -> tuple | None:
        """One generated request; what is wrong with its answer, or None."""
        label, case = item
        response = case.call(base_url=url, timeout=120)
        if response.status_code >= 500:
            return (label, response.status_code, case.body, response.text[:200])
        if response.status_code >= 400:
            try:
                err = response.json()["error"]
                ok = isinstance(err["message"], str) and isinstance(err["type"], str)
            except Exception:
                ok = False
            if not ok:
                return (label, response.status_code, case.body, response.text[:200])
        return None

    # every case is made first, then sent 8 at a time, as clients do (the scheduler batches them).
    # Not sent while hypothesis makes the next ones: it walks sys.modules to describe a strategy
    # that hit its recursion limit, and a sending thread importing a module then fails that walk
    # ("dictionary changed size during iteration", in hypothesis itself: seen in a CI run)
    cases = []
    for op in ops:
        COUNTS[op.label] = 0

        @settings(
            max_examples=per_op,
            deadline=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(case=op.as_strategy())
        def collect(case):
            if isinstance(case.body, dict):
                if isinstance(case.body.get("model"), str):
                    case.body["model"] = model  # else nearly every request is a 404
                if (
                    case.body.get("max_tokens") is None
                    and case.body.get("max_completion_tokens") is None
                ):
                    case.body["max_tokens"] = (
                        2  # else the reply may run to the end of the 8192-token context
                    )
                for key in ("max_tokens", "max_completion_tokens"):
                    if (
                        isinstance(case.body.get(key), int)
                        and not isinstance(case.body.get(key), bool)
                        and case.body[key] > 2
                    ):
                        case.body[key] = 2
            cases.append((op.label, case))

        collect()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, cases))
    for label, _ in cases:
        COUNTS[label] += 1
    failures = [f for f in answers if f is not None]
    total = sum(COUNTS.values())
    print(f"\nSOAK SCHEMATHESIS requests={total} {COUNTS}")
    assert not failures, failures[:5]
    assert total >= MIN_TOTAL, COUNTS
