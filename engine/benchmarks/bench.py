"""``minisgl-chat bench``: ``decode`` runs our engine and Hugging Face transformers on the same
weights in the same run; ``offline`` runs nano-vllm's 256-request workload (and transformers on
a subset of it) and compares with the memory-bandwidth floor; ``multiturn`` runs chats with the
radix prefix cache and without. Each prints a readable table and then one JSON line per
configuration."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ..config import EngineConfig
from ..errors import UserError
from .decode_bench import compare_llamacpp, print_table, run_decode
from .multiturn_bench import print_multiturn_table, run_multiturn
from .offline_bench import print_offline, run_offline, run_offline_dp

BENCHES = {
    "decode": (run_decode, print_table),
    "offline": (run_offline, print_offline),
    "multiturn": (run_multiturn, print_multiturn_table),
}


def _bench_rank(rank: int, args: argparse.Namespace, config: EngineConfig, addr: str) -> None:
    """One tensor-parallel rank of a bench: every rank runs the same schedule (SPMD); rank 0
    prints. transformers is not compared under --tp (it would run on rank 0 alone)."""
    from ..distributed import init_tp, shutdown_tp
    from ..model_loader import resolve_device
    from ..workers.scheduler_worker import rank_device

    config = replace(config, device=rank_device(config, rank))
    init_tp(rank, config.tp, f"tcp://{addr}", resolve_device(config.device), timeout_s=600)
    if args.bench == "decode" and args.compare_llamacpp:
        rows = compare_llamacpp(args, config)
        for row in rows:
            print(json.dumps(row))
        return 0
    run, show = BENCHES[args.bench]
    rows = run(args, config)
    if rank == 0:
        show(rows)
        for row in rows:
            print(json.dumps(row), flush=True)
    shutdown_tp()


def _print_rows(rows: list[dict]) -> None:
    for row in rows:
        print(json.dumps(row))


def _run_dp(args: argparse.Namespace, config: EngineConfig) -> None:
    """``--dp N``: offline with one replica per GPU, multiturn through the front end's router."""
    from ..api.server import prepare_model

    if args.bench == "offline" and args.num_requests < config.dp:
        raise UserError(
            f"--num-requests {args.num_requests} leaves a replica of --dp {config.dp} without work; ask for at least {config.dp}"
        )

    if args.bench == "decode" or config.tp > 1 or getattr(args, "compare_hf", False):
        raise UserError(
            "bench --dp N runs offline (one replica per GPU) and multiturn (through the front end's router), "
            "with --tp 1 and without --compare-hf"
        )
    config, model_config, _ = prepare_model(
        config
    )  # resolves the model once for all replicas and checks the GPUs
    if args.bench == "offline":
        rows = run_offline_dp(args, config)
        print_offline(rows)
    else:
        from .dp_bench import print_routed_table, run_multiturn_routed

        rows = run_multiturn_routed(
            args, config, model_config.max_context_len, model_config.vocab_size
        )
        print_routed_table(rows)
    _print_rows(rows)


def _run_tp(args: argparse.Namespace, config: EngineConfig) -> None:
    """``--tp N``: every rank in a process of its own (``_bench_rank``)."""
    import torch.multiprocessing as mp

    from ..api.server import prepare_model
    from ..workers.launcher import free_port

    config, _, _ = prepare_model(config)  # resolves the model once for all ranks and checks --tp
    if getattr(args, "compare_hf", False):
        raise UserError("--compare-hf runs transformers on one device; use it with --tp 1")
    mp.start_processes(
        _bench_rank,
        args=(args, config, f"127.0.0.1:{free_port()}"),
        nprocs=config.tp,
        join=True,
        start_method="spawn",
    )


def run_bench(args: argparse.Namespace) -> int:
    from ..args import engine_config_from_args

    config = engine_config_from_args(args)
    if args.bench not in BENCHES:  # pragma: no cover - argparse rejects unknown benches
        raise UserError(f"unknown benchmark {args.bench!r}")
    if config.dp < 1:
        raise UserError(f"--dp must be at least 1, got {config.dp}")
    if config.dp > 1:
        _run_dp(args, config)
        return 0
    if config.tp > 1:
        _run_tp(args, config)
        return 0
    if args.bench == "decode" and args.compare_llamacpp:
        _print_rows(compare_llamacpp(args, config))
        return 0
    run, show = BENCHES[args.bench]
    rows = run(args, config)
    show(rows)
    _print_rows(rows)
    return 0
