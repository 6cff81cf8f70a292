"""Tensor parallelism on CPU (gloo): two ranks in two processes give the same greedy tokens as one,
and logits within 1e-4 * max|logit| + 1e-5; each rank holds about half of the weights."""

from __future__ import annotations

import random

import pytest
import torch
import torch.multiprocessing as mp

from minisgl_engine.config import EngineConfig, ModelConfig
from minisgl_engine.distributed import TPInfo, set_tp_for_tests
from minisgl_engine.llm import LLM
from minisgl_engine.model_loader import load_hf_config
from minisgl_engine.models import build_model
from minisgl_engine.sampling_params import SamplingParams
from server_utils import free_port
from tiny_models import TINY
from tp_worker import run_rank

ARCHS = ["qwen3", "llama", "qwen2"]  # tiny qwen3 has 1 KV head: replicated on both ranks


def prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, TINY["vocab_size"]) for _ in range(rng.randrange(5, 70))] for _ in range(4)]


@pytest.fixture(scope="module")
def tp2_results(tiny_model, tmp_path_factory):
    jobs = [(arch, str(tiny_model(arch)[0]), prompts(i)) for i, arch in enumerate(ARCHS)]
    out = tmp_path_factory.mktemp("tp2")
    mp.start_processes(run_rank, args=(2, free_port(), jobs, str(out)), nprocs=2, join=True, start_method="spawn")
    ranks = [torch.load(out / f"rank{r}.pt") for r in range(2)]
    return jobs, ranks


@pytest.mark.parametrize("arch", ARCHS)
def test_tp2_matches_tp1(tp2_results, tiny_model, arch):
    jobs, ranks = tp2_results
    name, folder, ids = next(job for job in jobs if job[0] == arch)
    llm = LLM(folder, device="cpu", max_kv_tokens=4096, max_prefill_tokens=48, max_running_requests=8)
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
                return sum(p.numel() for p in build_model(model_config, torch.bfloat16).parameters())
        finally:
            set_tp_for_tests(TPInfo())

    total = count(TPInfo(0, 1))
    for rank in range(2):
        share = count(TPInfo(rank, 2)) / total
        assert 0.5 <= share < 0.502, f"rank {rank} holds {share:.2%} of the weights"
