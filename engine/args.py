"""The engine's command-line flags, shared by every subcommand that starts an engine."""

from __future__ import annotations

import argparse
from dataclasses import fields

from .config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The engine's flags, as one "engine" group of ``--help`` in this order."""
    d = EngineConfig()
    g = parser.add_argument_group("engine")
    _add_model_flags(g, d)
    _add_kv_cache_flags(g, d)
    _add_batching_flags(g, d)
    _add_parallel_flags(g, d)
    _add_kernel_flags(g, d)


def _add_model_flags(g: argparse._ArgumentGroup, d: EngineConfig) -> None:
    """Which model, where it runs and how its weights are stored."""
    g.add_argument(
        "--model",
        default=None,
        help="local Hugging Face folder, hub id or .gguf file (default: the built-in demo model)",
    )
    g.add_argument("--tokenizer", default=None, help="take the tokenizer from this folder")
    g.add_argument(
        "--device", default=d.device, help="auto | cpu | cuda | cuda:N (default: %(default)s)"
    )
    g.add_argument(
        "--dtype",
        default=d.dtype,
        choices=["auto", "bfloat16", "float16", "float32"],
        help="default: float32 on CPU, the checkpoint's 16-bit type on GPU",
    )
    g.add_argument(
        "--quantization",
        default=d.quantization,
        choices=["auto", "none", "gguf", "int4", "int8", "fp8"],
        help="auto = a GGUF's quantized weights stay quantized on CPU (widened on a GPU), other "
        "checkpoints as stored; gguf = keep a GGUF's blocks on a GPU too (one rank); none = widen "
        "every weight to --dtype (the reference); int4 | int8 = "
        "quantize a float checkpoint at load, in groups of 32; fp8 (GPU, compute capability 8.9+) = the decoder "
        "layers' projections in FP8 with a scale per row, half the bytes of bf16 (default: %(default)s)",
    )
    g.add_argument(
        "--dummy-weights",
        action="store_true",
        help="random weights (no download); with --config NAME or a --model folder's config",
    )
    g.add_argument(
        "--config", default=None, help="built-in model shape for --dummy-weights, e.g. qwen3-0.6b"
    )


def _add_kv_cache_flags(g: argparse._ArgumentGroup, d: EngineConfig) -> None:
    """The KV cache: its pages, their storage type and how much memory it takes."""
    g.add_argument(
        "--page-size",
        type=int,
        default=d.page_size,
        help="tokens per KV page (default: 0 = 64 on a GPU, 1 on CPU); the prefix cache shares whole pages",
    )
    g.add_argument(
        "--kv-dtype",
        default=d.kv_dtype,
        choices=["auto", "fp8", "float16", "bfloat16", "float32"],
        help="KV cache storage: auto = float16 on CPU (half of float32's memory, the same greedy replies), the "
        "model's dtype on a GPU; fp8 = e4m3, half the memory of 16 bits per token (twice the tokens fit), "
        "less precise (docs/benchmarks.md); float16 | bfloat16 | float32 on CPU "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--max-kv-tokens",
        type=int,
        default=None,
        help="KV cache size in tokens (default: from free memory)",
    )
    g.add_argument(
        "--mem-fraction",
        type=float,
        default=d.mem_fraction,
        help="share of free memory for the KV cache (default: %(default)s)",
    )


def _add_batching_flags(g: argparse._ArgumentGroup, d: EngineConfig) -> None:
    """What the scheduler runs at once, and how it shares cached prefixes."""
    g.add_argument(
        "--max-running-requests",
        type=int,
        default=d.max_running_requests,
        help="default: %(default)s",
    )
    g.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=None,
        help="token budget of one prefill batch; longer prompts are chunked (default: 8192 on a GPU, 512 on CPU)",
    )
    g.add_argument(
        "--cache",
        default=d.cache,
        choices=["radix", "naive"],
        help="KV cache manager: radix shares the KV of common prefixes, naive shares nothing (default: %(default)s)",
    )


def _add_parallel_flags(g: argparse._ArgumentGroup, d: EngineConfig) -> None:
    """Tensor and data parallelism."""
    g.add_argument(
        "--tp",
        type=int,
        default=d.tp,
        help="tensor-parallel ranks, one GPU each (default: %(default)s)",
    )
    g.add_argument(
        "--dp",
        type=int,
        default=d.dp,
        help="data-parallel replicas: N copies of the engine (--tp GPUs each) behind one front end, for more throughput from a small model (default: %(default)s)",
    )
    g.add_argument(
        "--dp-routing",
        default=d.dp_routing,
        choices=["prefix", "round-robin"],
        help="with --dp: send a request to the replica holding the longest cached prefix of its prompt, else the least loaded (prefix), or take turns (default: %(default)s)",
    )


def _add_kernel_flags(g: argparse._ArgumentGroup, d: EngineConfig) -> None:
    """Attention and the kernels, CUDA graphs, overlap scheduling, CPU threads."""
    g.add_argument(
        "--attn",
        default=d.attn,
        choices=["auto", "flashinfer", "torch"],
        help="attention backend: auto = FlashInfer on CUDA when its kernels build, else torch (default: %(default)s)",
    )
    g.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=d.cuda_graph_max_bs,
        help="capture CUDA graphs for decode batches up to this size; 0 disables them (default: %(default)s)",
    )
    g.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="on CUDA, do not prepare the next step while the GPU runs the current one (for comparison)",
    )
    g.add_argument(
        "--cpu-threads",
        type=int,
        default=d.cpu_threads,
        help="on CPU, compute threads; 0 = one per core that other processes leave free, re-checked as they come and go (default: %(default)s)",
    )
    g.add_argument(
        "--no-fused-kernels",
        dest="fused_kernels",
        action="store_false",
        help="on CUDA, do not use the Triton kernels (fused q/k norm + RoPE + KV store, small-batch matrix products; for comparison)",
    )


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    names = {f.name for f in fields(EngineConfig)}
    return EngineConfig(**{k: v for k, v in vars(args).items() if k in names})


def add_bench_args(parser: argparse.ArgumentParser, parser_class: type = argparse.ArgumentParser):
    """The engine's benchmarks; returns the subparsers so that the app adds its own (`bench page`)."""
    sub = parser.add_subparsers(dest="bench", parser_class=parser_class, required=True)
    _add_decode_bench(sub)
    _add_offline_bench(sub)
    _add_multiturn_bench(sub)
    return sub


def _add_decode_bench(sub: argparse._SubParsersAction) -> None:
    """``bench decode``: fixed batch sizes and lengths."""
    dec = sub.add_parser("decode", help="decode tok/s and time to first token at fixed lengths")
    dec.add_argument("--batch-size", type=int, nargs="+", default=[1])
    dec.add_argument("--input-len", type=int, nargs="+", default=[128])
    dec.add_argument("--output-len", type=int, default=128)
    dec.add_argument(
        "--compare-hf",
        action="store_true",
        help="also run transformers' generate on the same weights",
    )
    dec.add_argument(
        "--compare-llamacpp",
        action="store_true",
        help="CPU, a GGUF model: run llama.cpp (llama-cpp-python, pip install -e '.[bench]') on the same file, "
        "same prompts and threads, alternating with our engine; one JSON line per engine and input length",
    )
    dec.add_argument(
        "--repeat", type=int, default=1, help="timed runs per configuration; the best is reported"
    )
    dec.add_argument(
        "--busy-cores",
        type=int,
        default=0,
        help="keep this many cores busy with other processes for the run (the CPU path under load; default: %(default)s)",
    )
    add_engine_args(dec)


def _add_offline_bench(sub: argparse._SubParsersAction) -> None:
    """``bench offline``: nano-vllm's offline workload."""
    off = sub.add_parser(
        "offline",
        help="nano-vllm's offline workload: 256 requests, random lengths, sampled, ignore_eos",
    )
    off.add_argument("--num-requests", type=int, default=256)
    off.add_argument("--max-input-len", type=int, default=1024)
    off.add_argument("--max-output-len", type=int, default=1024)
    off.add_argument(
        "--compare-hf",
        action="store_true",
        help="also run transformers on the first --hf-requests requests",
    )
    off.add_argument(
        "--hf-requests",
        type=int,
        default=64,
        help="requests transformers runs with --compare-hf (default: %(default)s)",
    )
    off.add_argument(
        "--hf-output-len",
        type=int,
        default=64,
        help="cap on those requests' outputs (default: %(default)s)",
    )
    off.add_argument(
        "--extras-share",
        type=float,
        default=0.0,
        help="this share of the requests also uses penalties + logprobs, and as many a JSON schema "
        "(needs the model's tokenizer, or --tokenizer); default: %(default)s",
    )
    add_engine_args(off)


def _add_multiturn_bench(sub: argparse._SubParsersAction) -> None:
    """``bench multiturn``: chat turns with the radix cache and without."""
    # defaults sized so that both caches finish in about two minutes on 2 CPU cores (demo model)
    multi = sub.add_parser(
        "multiturn",
        help="time to first token per chat turn with --cache radix and naive side by side (runs both)",
    )
    multi.add_argument(
        "--conversations",
        type=int,
        default=16,
        help="concurrent conversations (default: %(default)s)",
    )
    multi.add_argument(
        "--turns", type=int, default=8, help="turns per conversation (default: %(default)s)"
    )
    multi.add_argument(
        "--system-len",
        type=int,
        default=256,
        help="shared system prompt, tokens (default: %(default)s)",
    )
    multi.add_argument(
        "--user-len", type=int, default=16, help="each user message, tokens (default: %(default)s)"
    )
    multi.add_argument(
        "--reply-len", type=int, default=8, help="each reply, tokens (default: %(default)s)"
    )
    add_engine_args(multi)
