"""Data parallelism (``--dp N``): N replicas of the engine behind one front end. The router on its
own, then real servers on CPU: a tiny Qwen3 with --dp 1 and --dp 2 answer alike, a chat's next
turn reaches the replica that cached its first, stop strings and aborts reach the right replica,
and a dead replica ends the app naming it."""

from __future__ import annotations

import json
import random
import subprocess

import httpx
import pytest
from server_utils import CLI, ServerProcess, kill_worker_and_expect_the_app_to_end, wait_until

from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete
from minisgl_engine.workers.router import TOKEN_BLOCK, ReplicaRouter, prompt_blocks


def chat(*turns: str) -> list[dict]:
    roles = ["user", "assistant"]
    return [{"role": roles[i % 2], "content": text} for i, text in enumerate(turns)]


# ---- the router -------------------------------------------------------------------------------


def test_a_chats_next_turn_goes_where_its_first_went():
    router = ReplicaRouter(2)
    history = chat(
        "Tell me about the history of the printing press in Europe, in detail please. " * 8
    )
    first = router.choose(prompt_blocks(None, history, None))
    router.started(first)
    router.ended(first)
    router.started(1 - first)  # the other replica is now the less loaded one
    later = chat(
        "Tell me about the history of the printing press in Europe, in detail please. " * 8,
        "It began...",
        "And then?",
    )
    assert router.choose(prompt_blocks(None, later, None)) == first


def test_prompts_that_share_nothing_spread_over_the_replicas():
    router = ReplicaRouter(3)
    rng = random.Random(0)
    chosen = []
    for _ in range(6):
        replica = router.choose(
            prompt_blocks(None, None, [rng.randrange(50000) for _ in range(100)])
        )
        router.started(replica)
        chosen.append(replica)
    assert sorted(chosen) == [0, 0, 1, 1, 2, 2]


def test_a_regenerated_reply_goes_to_the_replica_holding_its_prompt():
    router = ReplicaRouter(2)
    prompt = "short"  # shorter than one text block: the whole prompt is its only block
    first = router.choose(prompt_blocks(prompt, None, None))
    router.started(1 - first)
    assert router.choose(prompt_blocks(prompt, None, None)) == first


def test_a_short_shared_system_prompt_does_not_pile_chats_onto_one_replica():
    router = ReplicaRouter(2)
    system = list(range(2, 2 + 4 * TOKEN_BLOCK))  # 64 tokens, shared by every chat
    chosen = []
    for user in range(8):
        replica = router.choose(prompt_blocks(None, None, system + [1000 + user] * 16))
        router.started(replica)
        chosen.append(replica)
    assert chosen.count(0) == chosen.count(1) == 4


def test_a_long_history_stays_unless_its_replica_is_far_busier():
    router = ReplicaRouter(2)
    history = list(range(2, 2 + 1024))
    home = router.choose(prompt_blocks(None, None, history))
    for _ in range(3):  # three requests more than the other replica: 1024 cached tokens still win
        router.started(home)
    assert router.choose(prompt_blocks(None, None, history + [7] * 16)) == home
    for _ in range(2):  # five more: queueing behind them costs more than prefilling 1024 tokens
        router.started(home)
    assert router.choose(prompt_blocks(None, None, history + [8] * 16)) == 1 - home


def test_round_robin_takes_turns_whatever_is_cached():
    router = ReplicaRouter(2, "round-robin")
    prompt = prompt_blocks("the same prompt every time", None, None)
    assert [router.choose(prompt) for _ in range(4)] == [0, 1, 0, 1]


def test_the_router_forgets_the_least_recently_used_prefixes_beyond_its_bound():
    router = ReplicaRouter(2, max_blocks=100)
    for i in range(50):
        router.choose(prompt_blocks(None, None, [i] * (TOKEN_BLOCK * 10)))
    assert len(router.holders) == 100


def test_unknown_routing_is_refused():
    with pytest.raises(ValueError, match="round-robin"):
        ReplicaRouter(2, "random")


# ---- through real servers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def dp_servers(tiny_model, tiny_qwen3_server, tmp_path_factory):
    """The same tiny Qwen3 served with --dp 1 and --dp 2 on CPU; the demo model's tokenizer
    turns its ids into text and its chat template makes the prompts."""
    two = ServerProcess(
        "--model",
        str(tiny_model("qwen3")[0]),
        "--tokenizer",
        str(demo_model_dir()),
        "--dp",
        "2",
        log_path=tmp_path_factory.mktemp("dp-servers") / "dp2.log",
    )
    yield tiny_qwen3_server, two
    two.stop()


def complete(url: str, max_tokens: int = 12, **body) -> dict:
    route = "chat/completions" if "messages" in body else "completions"
    resp = httpx.post(
        f"{url}/v1/{route}", json={"max_tokens": max_tokens, "temperature": 0, **body}, timeout=60
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def text_of(reply: dict) -> str:
    choice = reply["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def replica_metrics(server: ServerProcess, name: str) -> list[float]:
    values = server.metrics()
    return [values[f'minisgl_replica_{name}{{replica="{i}"}}'] for i in range(2)]


def idle(server: ServerProcess) -> bool:
    return replica_metrics(server, "running_requests") == [0, 0] and replica_metrics(
        server, "waiting_requests"
    ) == [0, 0]


def test_serve_dp2_runs_one_scheduler_per_replica(dp_servers):
    _, two = dp_servers
    names = [" ".join(p.cmdline()) for p in two.workers()]
    for replica in range(2):
        assert sum(f"minisgl-DP{replica}-scheduler" in n for n in names) == 1, names
    assert not any("minisgl-TP0-scheduler" in n for n in names)
    assert "2 replicas" in two.output()


def test_serve_dp2_answers_like_dp1(dp_servers):
    from concurrent.futures import ThreadPoolExecutor

    one, two = dp_servers
    rng = random.Random(3)
    prompts = [[rng.randrange(2, 200) for _ in range(rng.randrange(5, 60))] for _ in range(6)]
    expected = [text_of(complete(one.url, prompt=p)) for p in prompts]
    assert [text_of(complete(two.url, prompt=p)) for p in prompts] == expected
    with ThreadPoolExecutor(6) as pool:  # together: spread over both replicas, batched within each
        together = list(pool.map(lambda p: text_of(complete(two.url, prompt=p)), prompts))
    assert together == expected
    finished = replica_metrics(two, "requests_finished_total")
    assert min(finished) >= 3, f"both replicas served some of the 12 requests: {finished}"


def test_a_chats_second_turn_hits_the_cache_of_the_replica_that_served_its_first(dp_servers):
    """A conversation's second turn (the first turn's prompt, the reply, a new message; as token
    ids, which is what the tokenizer makes of a chat) goes to the replica that holds the first
    turn's prompt in its prefix cache."""
    _, two = dp_servers
    rng = random.Random(5)
    assert wait_until(lambda: idle(two), 10)
    before_done, before_hits = (
        replica_metrics(two, "requests_finished_total"),
        replica_metrics(two, "prefix_cache_hit_tokens_total"),
    )
    first_turn = [rng.randrange(1, 320) for _ in range(150)]
    complete(two.url, prompt=first_turn, max_tokens=16)
    assert wait_until(lambda: idle(two), 10)
    done = replica_metrics(two, "requests_finished_total")
    [served] = [i for i in range(2) if done[i] > before_done[i]]
    hits = replica_metrics(two, "prefix_cache_hit_tokens_total")
    complete(
        two.url, prompt=first_turn + [rng.randrange(1, 320) for _ in range(16 + 20)]
    )  # the reply, then "Go on."
    assert wait_until(lambda: idle(two), 10)
    after_done, after_hits = (
        replica_metrics(two, "requests_finished_total"),
        replica_metrics(two, "prefix_cache_hit_tokens_total"),
    )
    assert after_done[served] == done[served] + 1 and after_done[1 - served] == done[1 - served], (
        "the second turn went elsewhere"
    )
    assert after_hits[served] - hits[served] >= len(first_turn) - 1, (
        "the second turn reused the first turn's prompt"
    )
    assert after_hits[1 - served] == hits[1 - served] == before_hits[1 - served]


def test_metrics_totals_are_the_replicas_added_up(dp_servers):
    _, two = dp_servers
    assert wait_until(lambda: idle(two), 10)
    values = two.metrics()
    for name in (
        "generation_tokens_total",
        "requests_finished_total",
        "kv_pages_total",
        "prefix_cache_hit_tokens_total",
    ):
        assert values[f"minisgl_{name}"] == sum(replica_metrics(two, name)), name


def served_by(server: ServerProcess, before: list[float]) -> int:
    """The replica whose finished requests grew since ``before`` (exactly one must have)."""
    after = finished_and_aborted(server)
    [replica] = [i for i in range(2) if after[i] + after[i + 2] > before[i] + before[i + 2]]
    return replica


def finished_and_aborted(server: ServerProcess) -> list[float]:
    return replica_metrics(server, "requests_finished_total") + replica_metrics(
        server, "requests_aborted_total"
    )


def test_a_stop_string_ends_the_request_on_its_own_replica(dp_servers):
    """On each replica in turn (new prompts alternate between idle replicas): a stop string the
    detokenizer finds must stop the scheduler of the replica that runs the request."""
    _, two = dp_servers
    rng = random.Random(5)
    replicas = set()
    for _ in range(2):
        prompt = [rng.randrange(2, 200) for _ in range(20)]
        assert wait_until(lambda: idle(two), 10)
        before = finished_and_aborted(two)
        free = text_of(complete(two.url, prompt=prompt, max_tokens=24))
        stop = free[len(free) // 2 : len(free) // 2 + 2]
        assert stop.strip(), f"no stop string to take from {free!r}"
        assert wait_until(lambda: idle(two), 10)
        replica = served_by(two, before)
        before, generated = (
            finished_and_aborted(two),
            sum(replica_metrics(two, "generation_tokens_total")),
        )
        reply = complete(two.url, prompt=prompt, max_tokens=4000, stop=[stop])
        assert reply["choices"][0]["finish_reason"] == "stop"
        assert wait_until(lambda: idle(two), 10), (
            "the replica kept generating after the stop string"
        )
        assert served_by(two, before) == replica, "the same prompt again goes where it is cached"
        assert sum(replica_metrics(two, "generation_tokens_total")) - generated < 100
        replicas.add(replica)
    assert replicas == {0, 1}


def test_a_client_that_goes_away_frees_its_replica(dp_servers):
    _, two = dp_servers
    replicas = set()
    for prompt in ([5, 6, 7, 8], [9, 10, 11, 12]):
        assert wait_until(lambda: idle(two), 10)
        before = finished_and_aborted(two)
        body = {
            "prompt": prompt,
            "max_tokens": 4000,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.stream("POST", f"{two.url}/v1/completions", json=body, timeout=60) as resp:
            for i, _line in enumerate(resp.iter_lines()):
                if i > 4:
                    break
        assert wait_until(lambda: idle(two), 10), replica_metrics(two, "running_requests")
        replicas.add(served_by(two, before))
    assert replicas == {0, 1}


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dp", "0"], "--tp and --dp must be at least 1"),
        (["--tp", "0"], "--tp and --dp must be at least 1"),
        (
            [
                "--dp",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                "0",
                "--dist-init-addr",
                "127.0.0.1:29999",
            ],
            "--dp runs its replicas on this machine only",
        ),
        (
            ["--dp", "2", "--tp", "2", "--dist-init-addr", "127.0.0.1:29999"],
            "--dp runs its replicas on this machine only",
        ),
    ],
)
def test_impossible_dp_flags_are_one_line_errors(tiny_model, flags, message):
    out = subprocess.run(
        [
            *CLI,
            "serve",
            "--device",
            "cpu",
            "--port",
            "0",
            "--model",
            str(tiny_model("llama")[0]),
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.skipif(
    not is_complete(demo_model_dir()),
    reason="demo model not pulled (its tokenizer is used): run `minisgl-chat pull`",
)
def test_bench_offline_with_dp2_deals_the_requests_to_both_replicas(tiny_model):
    """On a tiny model whose vocabulary (320) is smaller than the workload's ids (nano-vllm's
    [0, 10000]): they are bounded by it."""
    out = subprocess.run(
        [
            *CLI,
            "bench",
            "offline",
            "--model",
            str(tiny_model("qwen3")[0]),
            "--tokenizer",
            str(demo_model_dir()),
            "--device",
            "cpu",
            "--dp",
            "2",
            "--num-requests",
            "2",
            "--max-input-len",
            "40",
            "--max-output-len",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert (row["bench"], row["dp"], row["requests"], row["output_tokens"]) == ("offline", 2, 2, 32)
    assert len(row["replica_seconds"]) == 2 and row["seconds"] >= max(row["replica_seconds"])


def test_the_n_choices_of_a_prompt_and_its_prefill_share_one_replica(dp_servers):
    _, two = dp_servers
    assert wait_until(lambda: idle(two), 10)
    before = replica_metrics(two, "requests_finished_total")
    reply = complete(two.url, prompt=[7, 8, 9, 10, 11], max_tokens=4, n=4, seed=1)
    assert len(reply["choices"]) == 4
    assert wait_until(lambda: idle(two), 10)
    grew = [after - b for after, b in zip(replica_metrics(two, "requests_finished_total"), before)]
    assert sorted(grew) == [0, 5], f"the prefill and the 4 choices, all on one replica: {grew}"


def test_new_prompts_alternate_between_idle_replicas_even_after_a_repeat():
    router = ReplicaRouter(2)
    first = router.choose(prompt_blocks("a new prompt", None, None))
    assert (
        router.choose(prompt_blocks("a new prompt", None, None)) == first
    )  # the repeat: where it is cached
    assert router.choose(prompt_blocks("another new prompt", None, None)) == 1 - first


def test_killing_a_replica_ends_the_app_naming_it(dp_servers):
    """Last in this module: it ends the module's --dp 2 server (a server of its own cost ~30 s)."""
    _, two = dp_servers
    kill_worker_and_expect_the_app_to_end(
        two, "minisgl-DP1-scheduler", "minisgl-DP1-scheduler exited unexpectedly"
    )
