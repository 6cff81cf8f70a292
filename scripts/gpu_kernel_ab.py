"""Kernel-level A/B on the device: the committed tree's Triton kernels (.old, from `git archive
HEAD engine app`) against this tree's, and the LM head's two ways to float32 logits, each timed
as 20 calls inside one CUDA graph (as the engine runs them). Run by ``scripts/gpu_check.sh
kernelab``; ``python3 scripts/gpu_kernel_ab.py qk`` runs one part."""

from __future__ import annotations

import importlib.util
import sys

import torch
import torch.nn.functional as F
from gpu_timing import graph_us

from minisgl_engine.kernels import triton_kernels as new_tk

spec = importlib.util.spec_from_file_location("old_tk", ".old/minisgl_engine/triton_kernels.py")
old_tk = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old_tk)
DEV = torch.device("cuda")
PDL = new_tk.pdl_supported(DEV)


def attention() -> None:
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    for name, heads, kv_heads in (("0.6b", 16, 8), ("8b", 32, 8)):
        for batch in (1, 4, 16):
            for ctx in (128, 1024, 4096):
                dim = 128
                slots = batch * ctx + 1
                k = torch.randn(slots, kv_heads, dim, device=DEV, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                table = torch.arange(batch * ctx, device=DEV).view(batch, ctx)
                rows = torch.arange(batch, device=DEV)
                positions = torch.full((batch,), ctx - 1, device=DEV)
                q = torch.randn(batch, heads, dim, device=DEV, dtype=torch.bfloat16)
                splits = new_tk.decode_attention_splits(batch, kv_heads, sms)
                a = old_tk.decode_attention(q, k, v, table, rows, positions, dim**-0.5, splits, PDL)
                b = new_tk.decode_attention(q, k, v, table, rows, positions, dim**-0.5, splits, PDL)
                diff = (a.float() - b.float()).abs().max().item()
                t_old = graph_us(
                    lambda: old_tk.decode_attention(
                        q, k, v, table, rows, positions, dim**-0.5, splits, PDL
                    )
                )
                t_new = graph_us(
                    lambda: new_tk.decode_attention(
                        q, k, v, table, rows, positions, dim**-0.5, splits, PDL
                    )
                )
                print(
                    f"decode attention {name} batch {batch:3d} ctx {ctx:5d} splits {splits:2d}: committed {t_old:6.2f} us, "
                    f"this tree {t_new:6.2f} us (max diff {diff:.2e})",
                    flush=True,
                )


def fused_attention() -> None:
    """A decode step's attention after the qkv product: the committed tree's q/k kernel + split +
    merge against this tree's one kernel (decode_attention_qkv) at several smallest pieces."""
    from minisgl_engine.layers.rotary import RotaryEmbedding

    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    dim = 128
    rotary = RotaryEmbedding(dim, 40960, 1e6, None, torch.float32).to(DEV)
    for name, heads, kv_heads in (("0.6b", 16, 8), ("8b", 32, 8)):
        for batch in (1, 4, 16):
            for ctx in (128, 512, 2048, 4096):
                slots = batch * ctx + 1
                k = torch.randn(slots, kv_heads, dim, device=DEV, dtype=torch.bfloat16)
                v = torch.randn_like(k)
                table = torch.arange(batch * ctx, device=DEV).view(batch, ctx)
                rows = torch.arange(batch, device=DEV)
                positions = torch.full((batch,), ctx - 1, device=DEV)
                out_loc = table[:, ctx - 1].contiguous()
                qkv = torch.randn(
                    batch, (heads + 2 * kv_heads) * dim, device=DEV, dtype=torch.bfloat16
                )
                qw, kw = (
                    torch.randn(dim, device=DEV, dtype=torch.bfloat16),
                    torch.randn(dim, device=DEV, dtype=torch.bfloat16),
                )
                splits = new_tk.decode_attention_splits(batch, kv_heads, sms)
                counters = torch.zeros(batch * kv_heads, dtype=torch.int32, device=DEV)

                def chain():
                    q = old_tk.qk_norm_rope_store(
                        qkv,
                        heads,
                        kv_heads,
                        dim,
                        qw,
                        kw,
                        1e-6,
                        positions,
                        rotary.cos_sin_cache,
                        out_loc,
                        k,
                        v,
                        PDL,
                    )
                    return old_tk.decode_attention(
                        q, k, v, table, rows, positions, dim**-0.5, splits, PDL
                    )

                def fused(min_chunk):
                    return new_tk.decode_attention_qkv(
                        qkv,
                        heads,
                        kv_heads,
                        dim,
                        qw,
                        kw,
                        1e-6,
                        rotary.cos_sin_cache,
                        out_loc,
                        k,
                        v,
                        table,
                        rows,
                        positions,
                        dim**-0.5,
                        splits,
                        counters,
                        PDL,
                        min_chunk,
                    )

                reference = chain()
                line = f"attention from qkv {name} batch {batch:2d} ctx {ctx:5d}: q/k + split + merge {graph_us(chain):6.2f} us"
                for min_chunk in (64, 128, 256, 512):
                    diff = (fused(min_chunk).float() - reference.float()).abs().max().item()
                    line += f" | one kernel, pieces >= {min_chunk}: {graph_us(lambda: fused(min_chunk)):6.2f} us (diff {diff:.1e})"
                print(line, flush=True)


def lm_head() -> None:
    for name, hidden in (("0.6b", 1024), ("8b", 4096)):
        w = torch.randn(151936, hidden, device=DEV, dtype=torch.bfloat16) * 0.02
        for rows in (1, 8, 16, 64, 128, 256):
            x = torch.randn(rows, hidden, device=DEV, dtype=torch.bfloat16)
            out = torch.empty(rows, 151936, device=DEV, dtype=torch.float32)
            t_old = graph_us(lambda: out.copy_(F.linear(x, w).float()), calls=5, replays=10)
            t_new = graph_us(
                lambda: torch.mm(x, w.t(), out_dtype=torch.float32, out=out), calls=5, replays=10
            )
            print(
                f"lm head {name} rows {rows:3d}: bf16 product + float() + copy {t_old:7.1f} us, float32 product into the buffer {t_new:7.1f} us",
                flush=True,
            )


def qk() -> None:
    from minisgl_engine.layers.rotary import RotaryEmbedding

    for name, heads, kv_heads in (("0.6b", 16, 8), ("8b", 32, 8)):
        dim = 128
        rotary = RotaryEmbedding(dim, 40960, 1e6, None, torch.float32).to(DEV)
        for tokens in (1, 16, 64, 128, 256, 8192):
            qkv = torch.randn(
                tokens, (heads + 2 * kv_heads) * dim, device=DEV, dtype=torch.bfloat16
            )
            qw = torch.randn(dim, device=DEV, dtype=torch.bfloat16)
            kw = torch.randn(dim, device=DEV, dtype=torch.bfloat16)
            positions = torch.arange(tokens, device=DEV)
            out_loc = torch.arange(tokens, device=DEV)
            kc = torch.zeros(tokens, kv_heads, dim, device=DEV, dtype=torch.bfloat16)
            vc = torch.zeros_like(kc)
            args = (
                qkv,
                heads,
                kv_heads,
                dim,
                qw,
                kw,
                1e-6,
                positions,
                rotary.cos_sin_cache,
                out_loc,
                kc,
                vc,
                PDL,
            )
            t_old = graph_us(lambda: old_tk.qk_norm_rope_store(*args))
            t_new = graph_us(lambda: new_tk.qk_norm_rope_store(*args))
            print(
                f"qk norm+rope+store {name} tokens {tokens:5d}: a program per head {t_old:7.2f} us, "
                f"{new_tk.qk_heads_per_program(tokens, heads + 2 * kv_heads)} heads per program {t_new:7.2f} us",
                flush=True,
            )


if __name__ == "__main__":
    for part in sys.argv[1:] or ["lm_head", "attention", "qk", "fused_attention"]:
        globals()[part]()
