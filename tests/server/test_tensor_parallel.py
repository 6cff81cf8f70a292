"""Tensor parallelism on CPU (gloo): two ranks in two processes give the same greedy tokens as one,
and logits within 1e-4 * max|logit| + 1e-5; each rank holds about half of the weights."""

from __future__ import annotations

import random

import pytest
import torch
import torch.multiprocessing as mp
from server_utils import free_port
from tiny_models import TINY
from tp_worker import run_rank

from minisgl_engine.config import EngineConfig, ModelConfig
from minisgl_engine.distributed import TPInfo, set_tp_for_tests
from minisgl_engine.llm import LLM
from minisgl_engine.model_loader import load_hf_config
from minisgl_engine.models import build_model
from minisgl_engine.sampling_params import SamplingParams

ARCHS = ["qwen3", "llama", "qwen2"]  # tiny qwen3 has 1 KV head: replicated on both ranks


def prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(2, TINY["vocab_size"]) for _ in range(rng.randrange(5, 70))]
        for _ in range(4)
    ]


@pytest.fixture(scope="module")
def tp2_results(tiny_model, tmp_path_factory):
    jobs = [(arch, str(tiny_model(arch)[0]), prompts(i)) for i, arch in enumerate(ARCHS)]
    out = tmp_path_factory.mktemp("tp2")
    mp.start_processes(
        run_rank, args=(2, free_port(), jobs, str(out)), nprocs=2, join=True, start_method="spawn"
    )
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    return jobs, ranks


@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_matches_tp1(tp2_results, tiny_model, arch):
    jobs, ranks = tp2_results
    name, folder, ids = next(job for job in jobs if job[0] == arch)
    llm = LLM(
        folder, device="cpu", max_kv_tokens=4096, max_prefill_tokens=48, max_running_requests=8
    )
    expected = [r.token_ids for r in llm.generate(ids, SamplingParams(max_tokens=16))]
    ref_logits = llm.score(ids[0] + expected[0], prefill_len=len(ids[0]))
    for rank in ranks:  # both ranks took the same decisions
        outputs, logits = rank[name]
        assert outputs == expected
        tol = 1e-4 * ref_logits.abs().max().item() + 1e-5
        assert (logits - ref_logits).abs().max().item() <= tol


@pytest.mark.parametrize("config_name", ["qwen3-0.6b", "qwen3-8b"])
def test_each_rank_holds_about_half_of_the_weights(config_name):
    model_config = ModelConfig.from_hf(load_hf_config(EngineConfig(config=config_name), None))

    def count(tp: TPInfo) -> int:
        set_tp_for_tests(tp)
        try:
            with torch.device("meta"):
                return sum(
                    p.numel() for p in build_model(model_config, torch.bfloat16).parameters()
                )
        finally:
            set_tp_for_tests(TPInfo())

    total = count(TPInfo(0, 1))
    for rank in range(2):
        share = count(TPInfo(rank, 2)) / total
        assert 0.5 <= share < 0.502, f"rank {rank} holds {share:.2%} of the weights"


# ---- through the real server ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tp_servers(tiny_model, tiny_qwen3_server, tmp_path_factory):
    """The same tiny Qwen3 (one KV head: replicated on both ranks) served with --tp 1 and
    --tp 2 on CPU; the demo model's tokenizer turns its ids into text."""
    from server_utils import ServerProcess

    from minisgl_engine.weights.demo import demo_model_dir

    two = ServerProcess(
        "--model",
        str(tiny_model("qwen3")[0]),
        "--tokenizer",
        str(demo_model_dir()),
        "--tp",
        "2",
        log_path=tmp_path_factory.mktemp("tp-servers") / "tp2.log",
    )
    yield tiny_qwen3_server, two
    two.stop()


def complete(url: str, prompt, max_tokens: int = 12) -> str:
    import httpx

    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    resp = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def test_serve_tp2_runs_two_scheduler_ranks(tp_servers):
    _, two = tp_servers
    names = [" ".join(p.cmdline()) for p in two.workers()]
    assert sum("minisgl-TP0-scheduler" in n for n in names) == 1, names
    assert sum("minisgl-TP1-scheduler" in n for n in names) == 1, names


def test_serve_tp2_answers_like_tp1(tp_servers):
    from concurrent.futures import ThreadPoolExecutor

    one, two = tp_servers
    ids = prompts(7)
    for prompt in ids[:2]:
        assert complete(two.url, prompt) == complete(one.url, prompt)
    with ThreadPoolExecutor(4) as pool:  # concurrent requests batch together on both ranks
        together = list(pool.map(lambda p: complete(two.url, p), ids))
    assert together == [complete(one.url, p) for p in ids]


def test_a_tp_that_does_not_divide_the_heads_is_refused(tiny_model):
    import subprocess

    from server_utils import CLI, free_port

    folder = str(tiny_model("llama")[0])  # 4 heads, 2 KV heads
    proc = subprocess.run(
        [
            *CLI,
            "serve",
            "--device",
            "cpu",
            "--port",
            str(free_port()),
            "--model",
            folder,
            "--tp",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--tp 3" in proc.stderr and "attention heads" in proc.stderr


def test_two_nodes_on_one_machine_serve_a_chat(tp_servers, tiny_model, tmp_path):
    """--nnodes 2: node 1 runs rank 1 only, node 0 the front end and rank 0; they meet at
    --dist-init-addr. The answers equal the single-rank server's; node 1 ends with node 0."""
    import subprocess

    from server_utils import CLI, ServerProcess, free_port, wait_until

    from minisgl_engine.weights.demo import demo_model_dir

    one, _ = tp_servers
    common = [
        "--model",
        str(tiny_model("qwen3")[0]),
        "--tokenizer",
        str(demo_model_dir()),
        "--tp",
        "2",
        "--nnodes",
        "2",
        "--dist-init-addr",
        f"127.0.0.1:{free_port()}",
    ]
    node1_log = open(tmp_path / "node1.log", "wb")
    node1 = subprocess.Popen(
        [*CLI, "serve", "--device", "cpu", "--port", str(free_port()), *common, "--node-rank", "1"],
        stdout=node1_log,
        stderr=subprocess.STDOUT,
    )
    node0 = None
    try:
        node0 = ServerProcess(*common, "--node-rank", "0", log_path=tmp_path / "node0.log")
        assert "trusted network" in node0.output()
        for prompt in prompts(11)[:3]:
            assert complete(node0.url, prompt) == complete(one.url, prompt)
        node0.stop()
        import time

        start = time.monotonic()
        assert wait_until(lambda: node1.poll() is not None, 30), (
            "node 1 kept running after node 0 stopped"
        )
        print(f"node 1 ended {time.monotonic() - start:.1f} s after node 0")
    finally:
        if node0 is not None:
            node0.stop()
        if node1.poll() is None:
            node1.kill()
        node1_log.close()
    assert "minisgl-TP1-scheduler" in (tmp_path / "node1.log").read_text()


def test_bench_decode_with_tp2_prints_its_json_line(tiny_model):
    """`bench --tp 2` runs one process per rank (the same schedule on each); rank 0 prints."""
    import json
    import subprocess

    from server_utils import CLI

    folder = str(tiny_model("llama")[0])
    proc = subprocess.run(
        [
            *CLI,
            "bench",
            "decode",
            "--model",
            folder,
            "--device",
            "cpu",
            "--tp",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"bench"')]
    assert len(rows) == 1 and rows[0]["tp"] == 2 and rows[0]["engine_tok_s"] > 0


def test_shutdown_is_bounded_when_a_peer_never_leaves(tmp_path):
    """A rank whose peer is stuck (or gone) leaves within its timeout instead of hanging in the
    group's teardown, and exits cleanly (the bench's ranks must not hang at exit)."""
    from tp_worker import leave_rank

    ctx = mp.get_context("spawn")
    port = free_port()
    ranks = [ctx.Process(target=leave_rank, args=(r, 2, port, str(tmp_path))) for r in (0, 1)]
    for p in ranks:
        p.start()
    try:
        ranks[0].join(90)  # start-up (spawn, import torch) plus the 2 s timeout
        assert ranks[0].exitcode == 0, ranks[0].exitcode
        assert not (tmp_path / "rank0_left").exists(), "shutdown_tp returned instead of exiting"
        assert ranks[1].is_alive()
    finally:
        for p in ranks:
            p.kill()
            p.join(10)


def test_bench_and_the_ranks_import_without_the_web_stack():
    """`bench --tp` and a scheduler rank run where no web packages are installed (the GPU
    machines here have none): importing them must not pull starlette, FastAPI, uvicorn or Gradio."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('starlette', 'fastapi', 'uvicorn', 'gradio', 'pydantic'): sys.modules[name] = None\n"
        "import minisgl_engine.benchmarks.bench, minisgl_engine.workers.scheduler_worker\n"
        "from minisgl_engine.api.server import prepare_model\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_killing_a_rank_ends_the_app_naming_it(tp_servers):
    """Last in this module: it ends the module's --tp 2 server (a server of its own cost ~35 s)."""
    from server_utils import kill_worker_and_expect_the_app_to_end

    _, two = tp_servers
    kill_worker_and_expect_the_app_to_end(two, "minisgl-TP1-scheduler", "minisgl-TP1-scheduler")
