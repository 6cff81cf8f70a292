"""Tensor parallelism on two GPUs (NCCL, CUDA graphs capturing the all-reduce), and data
parallelism (a replica per GPU): run on a machine with 2 NVIDIA GPUs with
``pytest -m cuda tests/gpu/test_cuda_tp.py``; skipped elsewhere."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from server_utils import free_port
from test_cuda import agreement, hf_last_logits, random_sequences, rel_error
from tp_worker import score_rank

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs"),
]


def test_tp2_bf16_agrees_with_float32_as_well_as_tp1(tmp_path):
    from transformers import AutoModelForCausalLM

    from minisgl_engine.config import EngineConfig
    from minisgl_engine.llm import LLM
    from minisgl_engine.model_loader import load_hf_config

    hf_config = load_hf_config(EngineConfig(config="qwen3-0.6b"), None)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    folder = tmp_path / "model"
    hf.to(torch.bfloat16).save_pretrained(
        folder
    )  # what both engines load (tp 2: each rank its slices)
    positions = 32
    seqs = random_sequences(64, positions, seed=3)
    ref = hf_last_logits(hf.float().cuda().eval(), seqs, positions)
    del hf
    one = LLM(
        str(folder),
        device="cuda:0",
        dtype="bfloat16",
        max_kv_tokens=40_000,
        max_running_requests=64,
        cuda_graph_max_bs=64,
    )
    tp1 = torch.cat(
        [
            rows[-positions - 1 : -1]
            for rows in one.score_batch(seqs, [len(s) - positions for s in seqs])
        ]
    )
    del one
    torch.cuda.empty_cache()
    mp.start_processes(
        score_rank,
        args=(2, free_port(), str(folder), seqs, positions, str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    tp2 = torch.load(tmp_path / "tp_logits.pt").cuda()
    figures = {
        name: (agreement(x, ref), rel_error(x, ref)) for name, x in (("tp1", tp1), ("tp2", tp2))
    }
    print("top-1 agreement with float32 transformers (%), relative logit error:", figures)
    assert figures["tp2"][0] >= figures["tp1"][0] - 1.0, figures


def test_all_reduce_one_shot_and_nccl_give_nccls_sums(tmp_path):
    """The one-shot all-reduce (small bf16 tensors, symmetric memory) gives exactly NCCL's sums,
    eagerly and replayed from a CUDA graph with alternating buffers; large tensors use NCCL."""
    import json

    from tp_worker import all_reduce_rank

    mp.start_processes(
        all_reduce_rank,
        args=(2, free_port(), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    found = json.loads((tmp_path / "all_reduce.json").read_text())
    print("all_reduce checks:", found)
    assert found.pop("one_shot"), "the one-shot all-reduce did not start on this machine"
    assert all(v in ("exact", "rounding") for v in found.values()), found


@pytest.mark.parametrize("hidden", [4096, 1024])  # the 8B shape's, the 0.6B shape's
def test_fused_all_reduce_norm_matches_all_reduce_then_norm(tmp_path, hidden):
    """All-reduce + residual add + RMSNorm in one kernel (FlashInfer's Lamport one-shot) gives
    what NCCL's sum and FlashInfer's add + norm give, eagerly and chained in a CUDA graph. The
    ranks get 180 s (a first run builds FlashInfer's module, ~2 min): past that they are taken
    to hang, as a `serve --tp 2` of the 0.6B shape seemed to (docs/benchmarks.md)."""
    import json
    import time

    from tp_worker import fused_norm_rank

    ranks = mp.start_processes(
        fused_norm_rank,
        args=(2, free_port(), str(tmp_path), hidden),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 180
    while not ranks.join(timeout=5):
        if time.monotonic() > deadline:
            for proc in ranks.processes:
                proc.kill()
            pytest.fail(
                f"the fused all-reduce + RMSNorm ranks (hidden {hidden}) did not finish in 180 s"
            )
    found = json.loads((tmp_path / f"fused_norm_{hidden}.json").read_text())
    print(f"fused all-reduce + norm checks, hidden {hidden}:", found)
    assert found.pop("fused"), "the fused all-reduce + RMSNorm did not start on this machine"
    assert found and all(v in ("exact", "rounding") for v in found.values()), found


def test_bench_offline_dp2_runs_a_replica_on_each_gpu():
    import json
    import subprocess

    from server_utils import CLI

    out = subprocess.run(
        [
            *CLI,
            "bench",
            "offline",
            "--device",
            "cuda",
            "--dummy-weights",
            "--config",
            "qwen3-0.6b",
            "--dp",
            "2",
            "--num-requests",
            "16",
            "--max-input-len",
            "200",
            "--max-output-len",
            "120",
        ],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(row)
    assert row["replica_devices"] == ["cuda:0", "cuda:1"] and row["requests"] == 16


def test_serve_dp2_answers_from_both_gpus_and_stops_on_sigterm(tmp_path):
    """``serve --dp 2``: each replica takes its own GPU's memory, concurrent requests are spread
    over both, SIGTERM ends every process with exit code 0."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import psutil
    from server_utils import ServerProcess, wait_until

    srv = ServerProcess(
        "--device",
        "cuda",
        "--dummy-weights",
        "--config",
        "qwen3-0.6b",
        "--dp",
        "2",
        log_path=tmp_path / "dp2.log",
        timeout=500,
    )
    try:
        free = [torch.cuda.mem_get_info(i)[0] / torch.cuda.mem_get_info(i)[1] for i in range(2)]
        assert max(free) < 0.5, f"a GPU is mostly free: {free}"
        rng = random.Random(0)
        prompts = [[rng.randrange(10, 10000) for _ in range(50)] for _ in range(6)]

        def ask(prompt):
            body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            return httpx.post(f"{srv.url}/v1/completions", json=body, timeout=120)

        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(ask, prompts))
        assert all(
            r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8 for r in replies
        ), [r.text for r in replies]
        values = srv.metrics()
        finished = [
            values[f'minisgl_replica_requests_finished_total{{replica="{i}"}}'] for i in range(2)
        ]
        assert min(finished) >= 1, finished
        workers = srv.workers()
        srv.proc.terminate()
        assert srv.proc.wait(15) == 0
        assert wait_until(
            lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in workers),
            5.0,
        )
    finally:
        srv.stop()
