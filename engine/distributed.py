"""Tensor parallelism over torch.distributed: which rank this process is, and the few collective
operations the model and the scheduler need.

Every scheduler rank joins one process group (NCCL on GPUs, gloo on CPU). Layers call
:func:`all_reduce` and :func:`all_gather_last_dim`; with one rank both are no-ops, so the
single-GPU and CPU paths run the same code. What ranks exchange besides tensors (the scheduler's
incoming messages) travels as msgpack bytes inside a uint8 tensor (:func:`broadcast_bytes`):
never as pickled objects, which ``broadcast_object_list`` would unpickle.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ModelConfig

logger = logging.getLogger("minisgl.distributed")
SHUTDOWN_TIMEOUT_S = 5.0  # how long a rank waits for the group to come down before it exits anyway


@dataclass(frozen=True)
class TPInfo:
    rank: int = 0
    size: int = 1

    def split(self, n: int, what: str) -> int:
        """``n`` divided evenly across ranks (a clear error otherwise)."""
        if n % self.size:
            from .errors import UserError

            raise UserError(
                f"--tp {self.size} does not divide the model's {n} {what}; choose a --tp that does"
            )
        return n // self.size


_tp = TPInfo()
_cpu_group = None  # gloo group for the scheduler's messages (CPU tensors)
_one_shot: OneShotAllReduce | None = (
    None  # small all-reduces between GPUs, when the machine allows it
)
ONE_SHOT_MAX_BYTES = 1 << 20  # larger messages (prefill) go through NCCL
_fused_norm: FusedAllReduceNorm | None = (
    None  # all-reduce + residual add + RMSNorm in one kernel, on GPUs
)
FUSED_NORM_MAX_TOKENS = (
    128  # decode batches; longer inputs (prefill) take the all-reduce, then the norm
)


class OneShotAllReduce:
    """All-reduce of small bf16 tensors between the GPUs of one machine over symmetric memory
    (PyTorch's one-shot kernel: each GPU reads the others' buffers over NVLink and sums; no
    multicast). A decode step of the 8B shape does 72 of 8 KB per token; through NCCL inside a
    CUDA graph each costs ~16 us on two H200s, this ~6 us (scripts/allreduce_latency.py).

    Two buffers, one per call site (attention's output, the MLP's), so that consecutive
    all-reduces never write the buffer a peer may still be reading: each kernel starts with a
    barrier, so a rank can be at most one all-reduce ahead, and the next one uses the other
    buffer. Deterministic per call site, so it holds inside captured CUDA graphs too."""

    def __init__(self, device: torch.device, max_bytes: int = ONE_SHOT_MAX_BYTES) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group = dist.group.WORLD.group_name
        self.max_numel = max_bytes // 2
        self.buffers = [
            symm_mem.empty(self.max_numel, dtype=torch.bfloat16, device=device) for _ in range(2)
        ]
        for buf in self.buffers:
            symm_mem.rendezvous(buf, self.group)

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype == torch.bfloat16 and x.is_cuda and x.numel() <= self.max_numel

    def __call__(self, x: torch.Tensor, buffer: int) -> torch.Tensor:
        src = self.buffers[buffer][: x.numel()]
        src.copy_(x.reshape(-1))
        out = torch.empty_like(x)
        torch.ops.symm_mem.one_shot_all_reduce_out(src, "sum", self.group, out.view(-1))
        return out


def enable_one_shot_all_reduce(device: torch.device) -> bool:
    """Set up the one-shot all-reduce for this group (every rank calls it: the buffers are
    exchanged); False, logged, where it cannot run (a build or machine without symmetric
    memory). MINISGL_ALL_REDUCE=nccl keeps NCCL for everything (to compare)."""
    global _one_shot
    if os.environ.get("MINISGL_ALL_REDUCE", "").lower() == "nccl":
        return False
    try:
        _one_shot = OneShotAllReduce(device)
    except Exception as exc:
        logger.info(
            "one-shot all-reduce unavailable (%s); NCCL does every all-reduce",
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        _one_shot = None
    return _one_shot is not None


class FusedAllReduceNorm:
    """All-reduce, residual add and RMSNorm in one kernel: FlashInfer's port of TensorRT-LLM's
    all-reduce fusion, in its one-shot form (each GPU writes its partial sums into every peer's
    buffer and reads its own; "Lamport" buffers marked with -0.0 tell data that has arrived from
    data that has not, so no separate barrier kernel runs). In a decode step of the 8B shape this
    replaces 72 copies, 72 all-reduces and 72 add+norm kernels by 72 kernels.

    The kernel takes a table of pointers: every rank's scratch buffer, barrier flags and Lamport
    buffer, then a few counters of this rank. The buffers come from PyTorch's symmetric memory
    (which maps the peers' allocations into this process), so nothing but device pointers is
    exchanged, and never a pickled object."""

    def __init__(
        self, device: torch.device, hidden_size: int, max_tokens: int = FUSED_NORM_MAX_TOKENS
    ) -> None:
        import torch.distributed._symmetric_memory as symm_mem
        from flashinfer.comm import trtllm_ar

        self.ar = trtllm_ar
        self.hidden_size, self.max_tokens = hidden_size, max_tokens
        size = _tp.size
        two_mb = 1 << 21

        def aligned(n: int) -> int:
            return (n + two_mb - 1) // two_mb * two_mb

        scratch = size * max_tokens * hidden_size * 2
        flags = size * trtllm_ar.BarrierFlagCount * 4
        lamport_comm = min(size * max_tokens * hidden_size * 2, trtllm_ar.MAX_COMM_SIZE)
        lamport = aligned(3 * lamport_comm)  # three buffers used in turn
        group = dist.group.WORLD.group_name
        self.buffers, pointers = [], []
        for nbytes in (aligned(scratch), aligned(flags), lamport):
            buf = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
            buf.zero_()
            handle = symm_mem.rendezvous(buf, group)
            self.buffers.append(buf)
            pointers.extend(int(handle.buffer_ptrs[r]) for r in range(size))
        # this rank's Lamport buffer starts all "not arrived" (-0.0 in 16-bit floats)
        trtllm_ar.trtllm_lamport_initialize(self.buffers[2].data_ptr(), lamport // 2, torch.float16)
        # the kernel's counters: read count, flag, Lamport flag, Lamport buffer size, bytes to clear
        self.counters = torch.tensor([0, 0, 0, lamport_comm, 0], dtype=torch.int32, device=device)
        pointers.append(self.counters.data_ptr())
        self.workspace = torch.tensor(pointers, dtype=torch.int64, device=device)
        torch.cuda.synchronize(device)
        dist.barrier(
            group=_cpu_group
        )  # every rank's buffers are ready before any kernel writes to them

    def fits(self, x: torch.Tensor) -> bool:
        return (
            x.dim() == 2
            and x.shape[0] <= self.max_tokens
            and x.shape[1] == self.hidden_size
            and x.dtype == torch.bfloat16
        )

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(sum of x over ranks + residual), sum + residual)``, like RMSNorm(x, residual)
        after an all-reduce of ``x``."""
        norm_out, residual_out = torch.empty_like(x), torch.empty_like(residual)
        self.ar.trtllm_allreduce_fusion(
            allreduce_in=x.contiguous(),
            world_size=_tp.size,
            world_rank=_tp.rank,
            token_num=x.shape[0],
            hidden_dim=self.hidden_size,
            workspace_ptrs=self.workspace,
            launch_with_pdl=False,
            trigger_completion_at_end=True,
            fp32_acc=True,
            pattern_code=self.ar.AllReduceFusionPattern.kARResidualRMSNorm,
            use_oneshot=True,
            allreduce_out=None,
            residual_in=residual.contiguous(),
            residual_out=residual_out,
            norm_out=norm_out,
            quant_out=None,
            scale_out=None,
            rms_gamma=weight,
            rms_eps=eps,
            scale_factor=None,
            layout_code=None,
        )
        return norm_out, residual_out


def _all_ranks_agree(ok: bool) -> bool:
    """True only if ``ok`` on every rank (over the gloo group: a rank whose set-up failed must
    not leave the others waiting inside a kernel for its writes)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=_cpu_group)
    return bool(flag.item())


def fused_all_reduce_norm_wanted() -> bool:
    """Opt-in for now (MINISGL_ALL_REDUCE=fused): measured faster in ``bench decode --tp 2``
    (docs/benchmarks.md), not yet run through the whole GPU check; see issue 14's notes."""
    return os.environ.get("MINISGL_ALL_REDUCE", "").lower() == "fused"


def set_up_fused_all_reduce_norm(device: torch.device, hidden_size: int) -> bool:
    """Set up :class:`FusedAllReduceNorm` on every rank (all call it), check its result against
    the plain all-reduce, add and norm once, and report whether it is on. Off, logged, where
    FlashInfer cannot build its kernel or where any rank fails."""
    global _fused_norm
    _fused_norm = None
    if _tp.size == 1 or device.type != "cuda":
        return False
    reason = ""
    try:
        from flashinfer.comm.trtllm_ar import get_trtllm_comm_module

        get_trtllm_comm_module()  # builds the kernel (first run only), before any rank waits for another
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if not _all_ranks_agree(not reason):
        logger.info(
            "fused all-reduce + RMSNorm unavailable (%s); separate kernels",
            reason or "another rank failed",
        )
        return False
    fused = FusedAllReduceNorm(device, hidden_size)
    error = _check_fused_norm(fused, device)
    if not _all_ranks_agree(error < 0.05):
        logger.warning(
            "fused all-reduce + RMSNorm disagrees with the plain ops (max error %.3g); separate kernels",
            error,
        )
        return False
    _fused_norm = fused
    return True


def _check_fused_norm(fused: FusedAllReduceNorm, device: torch.device) -> float:
    """Largest difference between the fused kernel and all-reduce + add + norm in float32, over
    a few batch sizes (each rank contributes different values)."""
    worst = 0.0
    gen = torch.Generator(device=device).manual_seed(1234 + _tp.rank)
    for rows in (1, 3, fused.max_tokens):
        x = torch.randn(rows, fused.hidden_size, device=device, generator=gen).to(torch.bfloat16)
        residual = torch.randn(rows, fused.hidden_size, device=device, generator=gen).to(
            torch.bfloat16
        )
        weight = (1 + 0.1 * torch.randn(fused.hidden_size, device=device, generator=gen)).to(
            torch.bfloat16
        )
        for _ in range(4):  # the Lamport buffers rotate: check more than one turn
            normed, summed = fused(x, residual, weight, 1e-6)
        total = x.float()
        dist.all_reduce(total)
        expect_sum = total + residual.float()
        expect = (
            expect_sum
            * torch.rsqrt(expect_sum.pow(2).mean(-1, keepdim=True) + 1e-6)
            * weight.float()
        )
        worst = max(
            worst,
            (summed.float() - expect_sum).abs().max().item(),
            (normed.float() - expect).abs().max().item(),
        )
    return worst


def fused_all_reduce_norm() -> FusedAllReduceNorm | None:
    return _fused_norm


def local_head_counts(num_heads: int, num_kv_heads: int) -> tuple[int, int, int]:
    """(query heads, KV heads, which KV head block) this rank holds. With fewer KV heads than
    ranks, each KV head is replicated on ``size // num_kv_heads`` consecutive ranks."""
    tp = _tp
    heads = tp.split(num_heads, "attention heads")
    if num_kv_heads >= tp.size:
        return heads, tp.split(num_kv_heads, "KV heads"), tp.rank
    if tp.size % num_kv_heads:
        from .errors import UserError

        raise UserError(
            f"--tp {tp.size} is not a multiple of the model's {num_kv_heads} KV heads; choose a --tp that divides or is a multiple of it"
        )
    return heads, 1, tp.rank // (tp.size // num_kv_heads)


def get_tp() -> TPInfo:
    return _tp


def check_tp(model_config: ModelConfig, tp: int, device_name: str, dp: int = 1) -> None:
    """Refuse, before anything starts, a --tp (or --dp) the model or the machine cannot take."""
    from .config import check_parallel
    from .errors import UserError

    check_parallel(tp, dp)
    global _tp
    saved, _tp = _tp, TPInfo(0, tp)
    try:
        local_head_counts(model_config.num_heads, model_config.num_kv_heads)
        _tp.split(model_config.intermediate_size, "MLP intermediate features")
    finally:
        _tp = saved
    gpus = tp * dp
    if gpus > 1 and device_name.startswith("cuda:"):
        raise UserError(
            f"--device {device_name} names one GPU but --tp {tp} × --dp {dp} needs {gpus}; use --device cuda "
            "(CUDA_VISIBLE_DEVICES chooses which GPUs)"
        )
    if (
        gpus > 1
        and device_name != "cpu"
        and torch.cuda.is_available()
        and torch.cuda.device_count() < gpus
    ):
        have = torch.cuda.device_count()
        if dp == 1:
            raise UserError(f"--tp {tp} needs {tp} GPUs but this machine has {have}; lower --tp")
        raise UserError(
            f"--dp {dp} × --tp {tp} needs {gpus} GPUs but this machine has {have}; lower --dp or --tp (--dp × --tp ≤ {have})"
        )


def init_tp(
    rank: int, size: int, init_method: str, device: torch.device, timeout_s: float = 120.0
) -> TPInfo:
    """Join the tensor-parallel group (``init_method`` like ``tcp://127.0.0.1:PORT``).

    On a GPU the rank makes its device current first: Triton and FlashInfer launch on the
    current device, which is cuda:0 in every process until set (rank 1's kernels would run on
    GPU 0 with pointers into GPU 1)."""
    global _tp
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if size > 1:
        from datetime import timedelta

        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
    _tp = TPInfo(rank, size)
    global _cpu_group
    if size > 1:  # the scheduler's messages travel over gloo even when tensors use NCCL
        _cpu_group = dist.new_group(backend="gloo") if device.type == "cuda" else dist.group.WORLD
    if size > 1 and device.type == "cuda":
        enable_one_shot_all_reduce(device)
    return _tp


def shutdown_tp(timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
    """Leave the group in step with the other ranks, within ``timeout_s``.

    A process that exits with gloo's or NCCL's threads still running is aborted by the C++
    runtime ("terminate called without an active exception"), so every rank waits for the
    others, then tears the group down. That can hang: NCCL's teardown after CUDA graphs captured
    its collectives (pytorch/pytorch#115388), or a peer that died. So it runs in a thread, and a
    rank whose group is not down in time flushes its output and exits the process at once (what
    it had to do is done: this is the last call of a rank)."""
    global _tp, _cpu_group, _one_shot, _fused_norm
    _one_shot = _fused_norm = None
    if dist.is_initialized():
        done = threading.Event()

        def leave() -> None:
            try:
                dist.barrier(group=_cpu_group)
                dist.destroy_process_group()
            except Exception as exc:  # a peer already gone: nothing left to leave in step with
                logger.warning("rank %d: leaving the tensor-parallel group: %s", _tp.rank, exc)
            finally:
                done.set()

        threading.Thread(target=leave, name="tp-shutdown", daemon=True).start()
        if not done.wait(timeout_s):
            logger.warning(
                "rank %d: the tensor-parallel group did not come down within %.0f s; exiting without it",
                _tp.rank,
                timeout_s,
            )
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    _tp, _cpu_group = TPInfo(), None


def set_tp_for_tests(info: TPInfo) -> None:
    """Pretend to be one rank of a group without joining one (to build and load a shard)."""
    global _tp
    _tp = info


def all_reduce(x: torch.Tensor, buffer: int | None = None) -> torch.Tensor:
    """The sum of ``x`` over the ranks; use the return value (it may be a new tensor). A call
    site that passes ``buffer`` (0 or 1, alternating along the model: see OneShotAllReduce)
    gets the one-shot all-reduce for small tensors on GPUs; everything else goes through NCCL
    (or gloo on CPU)."""
    if _tp.size == 1:
        return x
    if buffer is not None and _one_shot is not None and _one_shot.fits(x):
        return _one_shot(x, buffer)
    dist.all_reduce(x)
    return x


def all_gather_last_dim(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dimension (vocabulary-parallel logits)."""
    if _tp.size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_tp.size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)


def min_over_ranks(value: int, device: torch.device) -> int:
    if _tp.size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def broadcast_bytes(data: bytes | None) -> bytes:
    """Rank 0's ``data`` on every rank (others pass None): a length, then the bytes, as CPU
    tensors over the gloo group."""
    if _tp.size == 1:
        return data or b""
    length = torch.tensor([len(data) if _tp.rank == 0 else 0], dtype=torch.int64)
    dist.broadcast(length, src=0, group=_cpu_group)
    n = int(length.item())
    if n == 0:
        return b""
    if _tp.rank == 0:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        payload = torch.empty(n, dtype=torch.uint8)
    dist.broadcast(payload, src=0, group=_cpu_group)
    return data if _tp.rank == 0 else payload.numpy().tobytes()
