"""What the first call of each FlashInfer kernel costs in a fresh process (module loading, any
just-in-time work), then a second call: run on a GPU machine after the kernels are built."""

import logging
import time

import torch

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
_t = time.perf_counter()


def lap(what: str) -> None:
    global _t
    torch.cuda.synchronize()
    now = time.perf_counter()
    print(f"{what}: {now - _t:.2f} s", flush=True)
    _t = now


import flashinfer  # noqa: E402

lap("import flashinfer")
x = torch.randn(8, 1024, dtype=torch.bfloat16, device="cuda")
w = torch.ones(1024, dtype=torch.bfloat16, device="cuda")
lap("cuda init")
flashinfer.norm.rmsnorm(x, w, 1e-6)
lap("rmsnorm first call")
flashinfer.norm.rmsnorm(x, w, 1e-6)
lap("rmsnorm second call")
flashinfer.activation.silu_and_mul(x)
lap("silu_and_mul first call")
q = torch.randn(8, 16, 128, dtype=torch.bfloat16, device="cuda")
k = torch.randn(8, 8, 128, dtype=torch.bfloat16, device="cuda")
cache = torch.randn(4096, 128, device="cuda")
pos = torch.arange(8, device="cuda")
flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
    pos, q.view(8, -1), k.view(8, -1), 128, cache, is_neox=True
)
lap("rope first call")
ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")
dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
kv = torch.randn(64, 1, 8, 128, dtype=torch.bfloat16, device="cuda")
dec.plan(
    torch.tensor([0, 8], dtype=torch.int32),
    torch.arange(8, dtype=torch.int32, device="cuda"),
    torch.tensor([1], dtype=torch.int32),
    16,
    8,
    128,
    1,
    q_data_type=torch.bfloat16,
    kv_data_type=torch.bfloat16,
)
lap("decode plan (attention module load)")
dec.run(q[:1], (kv, kv))
lap("decode run")
dec.run(q[:1], (kv, kv))
lap("decode run again")
flashinfer.sampling.top_k_top_p_sampling_from_logits(torch.randn(4, 1000, device="cuda"), 10, 0.9)
lap("sampling first call")
