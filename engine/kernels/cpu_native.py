"""The CPU engine's C kernels (cpu_kernels.c): built once with the system compiler, loaded with
ctypes, and the Python views of their structures.

A plain C file with no torch headers builds in a second or two, so there is nothing to ship per
platform: the first engine start builds it into the cache folder for this CPU (-march=native),
later starts load it. Without a compiler (or with ``MINISGL_NATIVE=0``) quantized weights use
torch's packed 4-bit kernel and the decode step runs as torch ops.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from filelock import FileLock

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu_kernels.c")
# -fassociative-math lets the compiler vectorise the float sums (attention's dot products); no
# -ffast-math, which would assume that no value is infinite (the softmax starts from -INFINITY)
FLAGS = [
    "-O3",
    "-march=native",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
]

_P, _I = ctypes.c_void_p, ctypes.c_int


class QWeightStruct(ctypes.Structure):
    """cpu_kernels.c's ``QWeight``."""

    _fields_ = [
        ("kind", _I),
        ("rows", _I),
        ("cols", _I),
        ("codes", _P),
        ("scales", _P),
        ("mult", ctypes.c_float),
        ("bias", _P),
    ]


class LayerStruct(ctypes.Structure):
    """cpu_kernels.c's ``Layer``."""

    _fields_ = [
        ("input_norm", _P),
        ("post_norm", _P),
        ("q_norm", _P),
        ("k_norm", _P),
        ("qkv", QWeightStruct),
        ("o", QWeightStruct),
        ("gate_up", QWeightStruct),
        ("down", QWeightStruct),
        ("k_cache", _P),
        ("v_cache", _P),
    ]


class ModelStruct(ctypes.Structure):
    """cpu_kernels.c's ``Model``."""

    _fields_ = [
        ("layers", _I),
        ("dim", _I),
        ("heads", _I),
        ("kv_heads", _I),
        ("head_dim", _I),
        ("inter", _I),
        ("max_len", _I),
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        ("layer", ctypes.POINTER(LayerStruct)),
        ("final_norm", _P),
        ("work", _P),
        ("kv_type", _I),
    ]


KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 2}  # cpu_kernels.c's KV_F32, KV_F16, KV_BF16


_SIGNATURES = {
    "kernel_path": ([], _I),
    "qmatmul": ([ctypes.POINTER(QWeightStruct), _P, _I, _P, _P], None),
    "qmatmul_work_bytes": ([_I, _I], ctypes.c_size_t),
    "qdequantize": ([ctypes.POINTER(QWeightStruct), _I, _I, _P], None),
    "qdequantize_rows": ([ctypes.POINTER(QWeightStruct), _P, _I, _P], None),
    "round_activations": ([_P, _I, _I], None),
    "decode_work_floats": ([ctypes.POINTER(ModelStruct)], ctypes.c_size_t),
    "decode_step": ([ctypes.POINTER(ModelStruct), _P, _P, _I, _P, _P], None),
    "kv_round_trip": ([_P, _I, _I, _P, _P], None),
}


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def library_path(compiler: str, extra_flags: tuple[str, ...] = ()) -> Path:
    from ..weights.demo import cache_root

    flags = [*FLAGS, *extra_flags]
    key = hashlib.sha256(
        SOURCE.read_bytes() + " ".join([compiler, *flags, platform.machine()]).encode()
    ).hexdigest()[:16]
    return cache_root() / "native" / f"cpu_kernels-{key}.so"


def _build(compiler: str, target: Path, extra_flags: tuple[str, ...]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_file():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            command = [compiler, *FLAGS, *extra_flags, str(SOURCE), "-o", tmp, "-lm"]
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=120, check=False
            )
            if result.returncode != 0:  # a compiler without OpenMP (Apple's clang): one thread
                command.remove("-fopenmp")
                result = subprocess.run(
                    command, capture_output=True, text=True, timeout=120, check=False
                )
            if result.returncode != 0:
                raise OSError(
                    result.stderr.strip().splitlines()[-1]
                    if result.stderr.strip()
                    else "compiler failed"
                )
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def load_library(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Build (once) and load the kernels; ``extra_flags`` pick another product path in tests
    (``-DMINISGL_NO_VNNI``, ``-DMINISGL_NO_AVX2``). Raises OSError when that fails."""
    compiler = _compiler()
    if compiler is None:
        raise OSError("no C compiler found")
    target = library_path(compiler, extra_flags)
    _build(compiler, target, extra_flags)
    lib = ctypes.CDLL(str(target))
    for name, (args, result) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, result
    return lib


@cache
def native_kernels() -> ctypes.CDLL | None:
    """The loaded library, or None (no compiler, a failed build, or MINISGL_NATIVE=0)."""
    if os.environ.get("MINISGL_NATIVE", "1") == "0":
        return None
    try:
        return load_library()
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning(
            "could not build the CPU kernels (%s): quantized products use torch's packed kernel",
            exc,
        )
        return None
