"""The GPU's Triton kernels compiled for a Hopper GPU (sm_90) on any machine: Triton's own
compiler and the ptxas shipped in its wheel need no GPU. Triton's interpreter, which runs the
kernel tests on a CPU, accepts code the compiler refuses (a jitted function whose ``return`` in a
constexpr ``if`` has another type than its last one: a whole one-row kernel fell back to widened
weights on an H100 for that), so CI compiles them too. The launcher's specialization (pointers
and sizes aligned to 16 bytes) is given, so the code is what a GPU would run: the 4-bit one-row
kernel widens its codes by PTX, with no integer-to-float conversion left in it.

Compiled in a fresh interpreter: one where ``TRITON_INTERPRET=1`` was set first (the CPU's
kernel tests set it) holds interpreted kernels, which cannot be compiled.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# found, not imported: triton imported here, before the CPU's kernel tests set TRITON_INTERPRET,
# would stay out of its interpreter for them
TRITON = importlib.util.find_spec("triton")
if TRITON is None:
    pytest.skip("triton is not installed", allow_module_level=True)
PTXAS = Path(TRITON.origin).parent / "backends" / "nvidia" / "bin" / "ptxas"

# the one-row group kernel's arguments, as triton_quant.group_gemv passes them
GROUP_GEMV_ARGS = {
    "x_ptr": "*bf16",
    "c_ptr": "*u8",
    "s_ptr": "*fp16",
    "y_ptr": "*bf16",
    "N": "i32",
    "up_offset": "i32",
    "mult": "fp32",
}
# (kernel, argument types, constexprs, num_warps), as the engine launches them at the Qwen3-8B shapes
CASES = {
    "one-row group, 4-bit codes, PTX, SwiGLU": (
        "triton_quant._group_gemv_kernel",
        GROUP_GEMV_ARGS,
        {"K": 4096, "BITS": 4, "SILU_MUL": True, "BLOCK_N": 4, "BLOCK_K": 2048, "PTX": True},
        4,
    ),
    "one-row group, 4-bit codes, converted": (
        "triton_quant._group_gemv_kernel",
        GROUP_GEMV_ARGS,
        {"K": 12288, "BITS": 4, "SILU_MUL": False, "BLOCK_N": 4, "BLOCK_K": 2048, "PTX": False},
        4,
    ),
    "one-row group, 8-bit codes, PTX": (
        "triton_quant._group_gemv_kernel",
        GROUP_GEMV_ARGS,
        {"K": 4096, "BITS": 8, "SILU_MUL": False, "BLOCK_N": 4, "BLOCK_K": 2048, "PTX": True},
        4,
    ),
    "tiled group, 4-bit codes": (
        "triton_quant._group_matmul_kernel",
        {
            "x_ptr": "*bf16",
            "c_ptr": "*u8",
            "s_ptr": "*fp16",
            "y_ptr": "*bf16",
            "M": "i32",
            "N": "i32",
            "stride_xm": "i32",
            "stride_ym": "i32",
            "mult": "fp32",
        },
        {"K": 4096, "BITS": 4, "BLOCK_M": 16, "BLOCK_N": 32, "PRECISION": "tf32"},
        4,
    ),
    "one-row FP8, norm inside, PDL": (
        "triton_kernels._gemv_kernel",
        {
            "x_ptr": "*bf16",
            "w_ptr": "*fp8e4nv",
            "b_ptr": "*fp8e4nv",
            "y_ptr": "*bf16",
            "r_ptr": "*bf16",
            "h_ptr": "*bf16",
            "g_ptr": "*bf16",
            "s_ptr": "*fp32",
            "eps": "fp32",
            "N": "i32",
            "stride_wn": "i32",
            "stride_wk": "i32",
            "up_offset": "i32",
        },
        {
            "K": 4096,
            "HAS_BIAS": False,
            "HAS_SCALE": True,
            "SILU_MUL": True,
            "NORM": True,
            "BLOCK_N": 4,
            "BLOCK_K": 4096,
            "USE_PDL": True,
        },
        4,
    ),
}

COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from minisgl_engine.kernels import triton_kernels, triton_quant

name, types, constexprs, warps = json.loads(sys.argv[1])
module, kernel = name.split(".")
fn = getattr({"triton_kernels": triton_kernels, "triton_quant": triton_quant}[module], kernel)
signature = dict(types, **{key: "constexpr" for key in constexprs})
# the launcher's specialization: pointers (and sizes) aligned to 16 bytes
aligned = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(types.values()) if t.startswith("*")}
source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
print(json.dumps({"ptx": compiled.asm["ptx"], "cubin_bytes": len(compiled.asm["cubin"])}))
"""


def compile_for_hopper(case: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE, json.dumps(CASES[case])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not (PTXAS.exists() or shutil.which("ptxas")), reason="no ptxas beside Triton or on PATH"
)
@pytest.mark.parametrize("case", list(CASES))
def test_a_gpu_kernel_compiles_for_hopper(case) -> None:
    built = compile_for_hopper(case)
    assert built["cubin_bytes"] > 0
    if "PTX" in case and "4-bit" in case:
        ptx = built["ptx"]
        assert "prmt.b32" in ptx and "0f4B000000" in ptx  # the widening's permute and 2^23
        assert "cvt.rn.f32.u16" not in ptx and "cvt.rn.f32.u8" not in ptx
    if "converted" in case:
        assert "cvt.rn.f32.u16" in built["ptx"] or "cvt.rn.f32.u8" in built["ptx"]
