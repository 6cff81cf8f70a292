"""Issue 18, goal 3 (Qwen3-8B batch 1): where the one-row products lose bandwidth, measured on the
device. Each product of a decoder layer (the norm inside qkv and gate_up, as the engine runs
them at batch 1) is timed as 20 calls inside one CUDA graph, for:

- the engine's one-row kernel (``triton_kernels._gemv_kernel``) at other tiles (rows per program
  ``BLOCK_N`` x K tile ``BLOCK_K``) and warp counts than the two the engine measures today;
- the same loop with the next K tile's weights loaded before the current tile is used
  (``prefetch``), and with each tile reduced to one number per row at once (``reduce``: far fewer
  registers, so more programs per SM keep loads in flight): tried, not adopted;
- the engine's row-walking plans (``GemvPlan(block_n, per_sm)``), adopted for large products
  with the norm inside (Qwen3-8B's gate_up);
- cuBLAS, and what reading the weights alone costs (a read-only kernel), the real roof.

Then a layer's four products back to back (as in a step, PDL between them) with the engine's
choice and with the fastest variant of each. Run by ``scripts/gpu_check.sh gemvvariants``.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from minisgl_engine.kernels import triton_kernels as tk
from minisgl_engine.kernels.fused_ops import gpu_time_us

DEV = torch.device("cuda")
PDL = tk.pdl_supported(DEV)
DT = torch.bfloat16


@triton.jit
def _gemv_variant_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    r_ptr,
    h_ptr,
    g_ptr,
    eps,
    N,
    stride_wn,
    up_offset,
    K: tl.constexpr,
    SILU_MUL: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    REDUCE: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    col_ok = cols < N
    w_tile = w_ptr + cols[:, None] * stride_wn + ks[None, :]
    w = tl.load(w_tile, mask=col_ok[:, None], other=0.0)
    w_up = w
    if SILU_MUL:
        w_up = tl.load(w_tile + up_offset * stride_wn, mask=col_ok[:, None], other=0.0)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if REDUCE:
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    sum_sq = tl.sum(tl.zeros((BLOCK_K,), dtype=tl.float32), axis=0)
    for k0 in range(0, K, BLOCK_K):
        if PREFETCH:  # the next tile's loads go out before this tile's arithmetic
            nxt = k0 + BLOCK_K
            nmask = col_ok[:, None] & ((nxt + ks) < K)[None, :]
            w_next = tl.load(w_tile + nxt, mask=nmask, other=0.0)
            w_up_next = w_next
            if SILU_MUL:
                w_up_next = tl.load(w_tile + up_offset * stride_wn + nxt, mask=nmask, other=0.0)
        x, part = tk._gemv_input(x_ptr, r_ptr, h_ptr, g_ptr, k0 + ks, pid == 0, NORM)
        sum_sq += part
        if REDUCE:
            acc += tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            if SILU_MUL:
                acc_up += tl.sum(w_up.to(tl.float32) * x[None, :], axis=1)
        else:
            acc += w.to(tl.float32) * x[None, :]
            if SILU_MUL:
                acc_up += w_up.to(tl.float32) * x[None, :]
        if PREFETCH:
            w = w_next
            w_up = w_up_next
        else:
            nxt = k0 + BLOCK_K
            nmask = col_ok[:, None] & ((nxt + ks) < K)[None, :]
            w = tl.load(w_tile + nxt, mask=nmask, other=0.0)
            if SILU_MUL:
                w_up = tl.load(w_tile + up_offset * stride_wn + nxt, mask=nmask, other=0.0)
    if REDUCE:
        y = acc
        y_up = acc_up
    else:
        y = tl.sum(acc, axis=1)
        y_up = tl.sum(acc_up, axis=1)
    if NORM:
        inv_rms = 1.0 / tl.sqrt(sum_sq / K + eps)
        y = y * inv_rms
        y_up = y_up * inv_rms
    if SILU_MUL:
        y = y * tl.sigmoid(y) * y_up
    tl.store(y_ptr + cols, y.to(y_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _read_kernel(w_ptr, out_ptr, total, BLOCK: tl.constexpr, PER_PROGRAM: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    base = pid * PER_PROGRAM
    for i in range(0, PER_PROGRAM, BLOCK):
        acc += tl.load(w_ptr + base + i + offs, mask=base + i + offs < total, other=0.0).to(
            tl.float32
        )
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


class Product:
    """One product of a decoder layer at one row, its inputs allocated once."""

    def __init__(self, name: str, n: int, k: int, silu: bool, norm: bool) -> None:
        self.name, self.n, self.k, self.silu, self.norm = name, n, k, silu, norm
        rows = 2 * n if silu else n
        self.w = torch.randn(rows, k, device=DEV, dtype=DT) * k**-0.5
        self.x = torch.randn(1, k, device=DEV, dtype=DT)
        self.r = torch.randn(1, k, device=DEV, dtype=DT)
        self.g = torch.randn(k, device=DEV, dtype=DT)
        self.y = torch.empty(1, n, device=DEV, dtype=DT)
        self.h = torch.empty(1, k, device=DEV, dtype=DT)
        self.bytes = self.w.numel() * 2

    def engine(self, block_n: int):
        """The engine's kernel as it runs today (``add_norm_gemv`` / ``gemv``)."""
        if self.norm:
            return lambda: tk.add_norm_gemv(
                self.x, self.r, self.g, 1e-6, self.w, silu_mul=self.silu, block_n=block_n, pdl=PDL
            )[0]
        return lambda: tk.gemv(self.x, self.w, silu_mul=self.silu, block_n=block_n, pdl=PDL)

    def engine_tiled(self, block_n: int, block_k: int, warps: int, norm: bool | None = None):
        """The engine's kernel with another tile and warp count (``norm=False``: without the
        norm inside, to see what it costs)."""
        extra = {"launch_pdl": True} if PDL else {}
        x, w = self.x, self.w
        norm = self.norm if norm is None else norm
        r, h, g = (self.r, self.h, self.g) if norm else (x, x, x)

        def run():
            tk._gemv_kernel[(triton.cdiv(self.n, block_n),)](
                x,
                w,
                w,
                self.y,
                r,
                h,
                g,
                1e-6,
                self.n,
                w.stride(0),
                w.stride(1),
                self.n,
                K=self.k,
                HAS_BIAS=False,
                SILU_MUL=self.silu,
                NORM=norm,
                BLOCK_N=block_n,
                BLOCK_K=block_k,
                USE_PDL=PDL,
                num_warps=warps,
                **extra,
            )
            return self.y

        return run

    def variant(self, block_n: int, block_k: int, warps: int, prefetch: bool, reduce: bool):
        extra = {"launch_pdl": True} if PDL else {}
        x, w = self.x, self.w
        r, h, g = (self.r, self.h, self.g) if self.norm else (x, x, x)

        def run():
            _gemv_variant_kernel[(triton.cdiv(self.n, block_n),)](
                x,
                w,
                self.y,
                r,
                h,
                g,
                1e-6,
                self.n,
                w.stride(0),
                self.n,
                K=self.k,
                SILU_MUL=self.silu,
                NORM=self.norm,
                BLOCK_N=block_n,
                BLOCK_K=block_k,
                USE_PDL=PDL,
                PREFETCH=prefetch,
                REDUCE=reduce,
                num_warps=warps,
                **extra,
            )
            return self.y

        return run

    def rows(self, block_n: int, per_sm: int):
        """The engine's row-walking plan (``GemvPlan(block_n, per_sm)``)."""
        if self.norm:
            return lambda: tk.add_norm_gemv(
                self.x,
                self.r,
                self.g,
                1e-6,
                self.w,
                silu_mul=self.silu,
                block_n=block_n,
                per_sm=per_sm,
                pdl=PDL,
            )[0]
        return lambda: tk.gemv(
            self.x, self.w, silu_mul=self.silu, block_n=block_n, per_sm=per_sm, pdl=PDL
        )

    def cublas(self):
        return lambda: F.linear(self.x, self.w)

    def reference(self) -> torch.Tensor:
        x = self.x.float()
        if self.norm:
            hh = (self.x.float() + self.r.float()).to(DT).float()
            x = hh * torch.rsqrt(hh.pow(2).mean(-1, keepdim=True) + 1e-6) * self.g.float()
        y = x @ self.w.float().t()
        if self.silu:
            gate, up = y[:, : self.n], y[:, self.n :]
            y = F.silu(gate) * up
        return y


def shapes(config: str) -> list[Product]:
    if config == "8b":
        return [
            Product("qkv+norm", 6144, 4096, False, True),
            Product("o", 4096, 4096, False, False),
            Product("gate_up+norm+silu", 12288, 4096, True, True),
            Product("down", 4096, 12288, False, False),
        ]
    return [
        Product("qkv+norm", 4096, 1024, False, True),
        Product("o", 1024, 2048, False, False),
        Product("gate_up+norm+silu", 3072, 1024, True, True),
        Product("down", 1024, 3072, False, False),
    ]


def candidates(p: Product) -> dict[str, object]:
    runs: dict[str, object] = {"cuBLAS (no norm, no SiLU)": p.cublas()}
    for block in (4, 8):
        if tk.gemv_block_k(p.k, block):
            runs[f"engine block {block} (bk {tk.gemv_block_k(p.k, block)}, 4 warps)"] = p.engine(
                block
            )
    for bn, bk, warps in ((4, 1024, 4), (8, 512, 4), (16, 512, 4), (8, 1024, 8)):
        if p.k % bk == 0:
            runs[f"engine kernel bn {bn} bk {bk} w{warps}"] = p.engine_tiled(bn, bk, warps)
    if p.norm:  # the same tiles without the norm inside: what the norm costs in the product
        for bn in (4, 8):
            if tk.gemv_block_k(p.k, bn):
                runs[f"engine kernel bn {bn} bk {tk.gemv_block_k(p.k, bn)} w4 WITHOUT the norm"] = (
                    p.engine_tiled(bn, tk.gemv_block_k(p.k, bn), 4, norm=False)
                )
    for prefetch, reduce in ((False, True), (True, True)):
        tag = "+".join(t for t, on in (("prefetch", prefetch), ("reduce", reduce)) if on)
        for bn, bk, warps in (
            (4, 1024, 4),
            (4, 2048, 4),
            (8, 1024, 4),
            (16, 512, 8),
            (4, 512, 2),
            (4, 2048, 2),
            (2, 1024, 1),
        ):
            if p.k % bk == 0 and (reduce or bn * bk <= 8192 * warps // 4):
                runs[f"{tag} bn {bn} bk {bk} w{warps}"] = p.variant(bn, bk, warps, prefetch, reduce)
    for bn in (1, 2, 4):
        for per_sm in (2, 4, 8):
            runs[f"rows bn {bn} {per_sm}/SM w{tk.gemv_rows_warps(p.k, bn, p.silu)}"] = p.rows(
                bn, per_sm
            )
    return runs


def read_roof(nbytes: int) -> float:
    """GPU time to read ``nbytes`` once (a bf16 sum, no writes), best of a few shapes."""
    w = torch.randn(nbytes // 2, device=DEV, dtype=DT)
    best = float("inf")
    for block, per in ((1024, 65536), (2048, 131072), (4096, 262144), (1024, 16384)):
        out = torch.empty(triton.cdiv(w.numel(), per), device=DEV, dtype=torch.float32)
        for warps in (4, 8):
            us = gpu_time_us(
                lambda: _read_kernel[(out.numel(),)](
                    w, out, w.numel(), BLOCK=block, PER_PROGRAM=per, num_warps=warps
                )
            )
            best = min(best, us)
    return best


def main(config: str) -> None:
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    print(f"== {config}: {torch.cuda.get_device_name(DEV)}, {sms} SMs, PDL {PDL}", flush=True)
    best_engine: dict[str, object] = {}
    best_any: dict[str, object] = {}
    products = shapes(config)
    for p in products:
        roof = read_roof(p.bytes)
        print(
            f"-- {p.name} [{p.n}{'x2' if p.silu else ''} x {p.k}] {p.bytes / 1e6:.1f} MB: read-only roof {roof:.2f} us "
            f"= {p.bytes / roof / 1e6:.2f} TB/s",
            flush=True,
        )
        ref = p.reference()
        results = []
        for label, fn in candidates(p).items():
            try:
                out = fn()
                torch.cuda.synchronize()
                err = (
                    ""
                    if label.startswith("cuBLAS")
                    else f" err {((out.float() - ref).abs().max() / ref.abs().max()).item():.1e}"
                )
                us = gpu_time_us(fn)
            except Exception as exc:  # a variant that does not compile here: report and go on
                print(f"   {label}: failed: {str(exc).splitlines()[0][:160]}", flush=True)
                continue
            results.append((us, label, fn))
            print(f"   {us:8.2f} us {p.bytes / us / 1e6:5.2f} TB/s  {label}{err}", flush=True)
        engine_runs = [r for r in results if r[1].startswith("engine block")]
        if not engine_runs:
            continue
        best_engine[p.name] = min(engine_runs)[2]
        best_any[p.name] = min(
            r for r in results if not r[1].startswith("cuBLAS") and "WITHOUT" not in r[1]
        )[2]
        print(
            f"   fastest: {min(results)[1]} ({min(results)[0]:.2f} us); engine's own best {min(engine_runs)[0]:.2f} us",
            flush=True,
        )
    total = sum(p.bytes for p in products)
    if len(best_engine) < len(products):
        return
    for label, chosen in (("engine's choice", best_engine), ("fastest variant of each", best_any)):
        fns = [chosen[p.name] for p in products]
        us = gpu_time_us(lambda: [f() for f in fns], reps=10)
        print(
            f"== a layer's four products back to back, {label}: {us:.2f} us = {total / us / 1e6:.2f} TB/s "
            f"(read-only roof of {total / 1e6:.0f} MB: see above)",
            flush=True,
        )


if __name__ == "__main__":
    for cfg in sys.argv[1:] or ["8b", "0.6b"]:
        main(cfg)
