"""The GPU's kernel libraries: can FlashInfer and Triton run here, which launch options the
Triton kernels take (``MINISGL_GEMV``), and building FlashInfer's kernels once.

FlashInfer compiles its kernels just in time with nvcc and caches them (under
``~/.cache/flashinfer``, or ``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``), so the first
start on a machine takes minutes and later starts take a second. We build every kernel the
engine will use up front, in one parallel ninja run, so that start-up says what it is doing
instead of stalling inside the first request; a machine without nvcc fails here, and the
engine falls back to the torch backend.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from ..env import env_choice

logger = logging.getLogger(__name__)

FLASHINFER_DTYPES = (torch.bfloat16, torch.float16)
FLASHINFER_HEAD_DIM_MULTIPLE = 64  # its prefill kernels' head sizes: 64, 128, 256
WORKSPACE_BYTES = 256 << 20  # FlashInfer's split-k scratch; its docs recommend 128 MB and up


def unavailable_reason(device: torch.device, dtype: torch.dtype, head_dim: int) -> str | None:
    """None if FlashInfer can serve this device, dtype and head size, else a short reason."""
    if device.type != "cuda":
        return "FlashInfer needs a CUDA device"
    if dtype not in FLASHINFER_DTYPES:
        return f"FlashInfer attention needs bfloat16 or float16, not {str(dtype).removeprefix('torch.')}"
    if head_dim % FLASHINFER_HEAD_DIM_MULTIPLE:
        # its prefill kernels build for other sizes, then fail at the first prompt ("Invalid
        # configuration", seen with 32) or read out of bounds (flashinfer-ai/flashinfer#4299)
        return f"FlashInfer's attention takes head sizes that are multiples of {FLASHINFER_HEAD_DIM_MULTIPLE} (this model's: {head_dim})"
    try:
        import flashinfer  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"flashinfer-python is not usable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); install the `cuda` extra"
    return None


def triton_unavailable_reason() -> str | None:
    """None if Triton (shipped with CUDA builds of torch) imports, else why not. Its kernels are
    in :mod:`.triton_kernels`."""
    try:
        import triton  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything
        return f"{type(exc).__name__}: {exc}"
    return None


GEMV_MODES = ("on", "nonorm", "nopdl", "off")


def gemv_mode() -> str:
    """``MINISGL_GEMV``: ``on`` (default: the one-row kernel where measured faster, launched as
    a programmatic dependent where the GPU can, the decoder's norms fused into it), ``nonorm``
    (the norms as their own kernels), ``nopdl`` (no norms fused, plain launches) or ``off`` (not
    tried): for measuring what each part buys."""
    return env_choice("MINISGL_GEMV", GEMV_MODES)


def pdl_wanted(device: torch.device) -> bool:
    """Whether the Triton kernels of a decode step (products, q/k-norm + RoPE, decode attention)
    launch as programmatic dependents: where the GPU can, unless ``MINISGL_GEMV`` says
    ``nopdl`` or ``off`` (the A/B of what PDL buys covers every kernel, not only the products)."""
    from .triton_kernels import pdl_supported  # Triton only where it is asked about

    return gemv_mode() in ("on", "nonorm") and pdl_supported(device)


def jit_specs(
    dtype: torch.dtype,
    head_dim: int,
    decode_tensor_cores: bool = True,
    kv_dtype: torch.dtype | None = None,
) -> list:
    """Every FlashInfer module the engine calls: paged attention (prefill, and decode on tensor
    cores, share one FA2 module; decode on CUDA cores is a module of its own), RMSNorm, RoPE,
    SiLU-and-mul and sampling. ``kv_dtype``: the KV pool's, where it is not the model's (FP8:
    attention modules of their own, which widen K/V as they load them)."""
    kv_dtype = kv_dtype or dtype
    from flashinfer.jit import (
        gen_act_and_mul_module,
        gen_batch_decode_module,
        gen_batch_prefill_module,
    )
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.rope import gen_rope_module
    from flashinfer.jit.sampling import gen_sampling_module

    attention = gen_batch_prefill_module(
        "fa2",
        dtype,
        kv_dtype,
        dtype,
        torch.int32,
        head_dim,
        head_dim,
        0,  # no RoPE inside attention (applied before)
        False,  # no sliding window
        False,  # no logits soft cap
        False,  # no fp16 QK reduction
    )
    specs = [
        attention,
        gen_norm_module(),
        gen_rope_module(),
        gen_act_and_mul_module("silu"),
        gen_sampling_module(),
    ]
    if not decode_tensor_cores:
        specs.append(
            gen_batch_decode_module(
                dtype, kv_dtype, dtype, torch.int32, head_dim, head_dim, 0, False, False
            )
        )
    return specs


def build_kernels(
    dtype: torch.dtype,
    head_dim: int,
    on_phase: Callable[[str], None] | None = None,
    decode_tensor_cores: bool = True,
    kv_dtype: torch.dtype | None = None,
) -> None:
    """Compile what is not cached yet (in parallel), reporting progress through ``on_phase``."""
    specs = jit_specs(dtype, head_dim, decode_tensor_cores, kv_dtype)
    missing = [spec for spec in specs if not spec.is_compiled]
    if not missing:
        return
    message = f"compiling attention kernels, first run only ({len(missing)} FlashInfer modules; a few minutes)"
    logger.warning(message)
    if on_phase is not None:
        on_phase(message)
    start = time.perf_counter()
    # One build per module, in parallel threads: each module's own ninja run then records what it
    # built, so loading it later finds it up to date (one combined ninja run, flashinfer's
    # build_jit_specs, left every module to be compiled again at its first use).
    with ThreadPoolExecutor(len(missing)) as pool:
        list(pool.map(lambda spec: spec.build(verbose=False), missing))
    logger.warning(
        "FlashInfer kernels compiled in %.0f s (cached for later starts)",
        time.perf_counter() - start,
    )
