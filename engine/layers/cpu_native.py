"""The C steps of a batch-1 decode layer on CPU (cpu_decode.c), built once with the system
compiler and loaded with ctypes.

A plain C file with no torch headers builds in about a second, so there is nothing to ship per
platform: the first engine start builds it into the cache folder, later starts load it. Without
a compiler (or with ``MINISGL_NATIVE=0``) the engine runs the same layer as torch ops.
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

SOURCE = Path(__file__).with_name("cpu_decode.c")
# -fassociative-math lets the compiler vectorise the dot products' sums; no -ffast-math, which
# would assume that no value is infinite (the softmax starts from -INFINITY)
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fassociative-math",
         "-fno-signed-zeros", "-fno-trapping-math"]

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "add_rmsnorm": [_P, _I, _P, _P, _F, _I, _P, _P, _I],
    "rope_store_attend": [_P, _I, _I, _I, _P, _P, _F, _P, _P, _P, _P, _P, _I, _F, _P, _P],
    "silu_mul": [_P, _I, _P],
}


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _library_path(compiler: str) -> Path:
    from ..weights.demo import cache_root

    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *FLAGS, platform.machine()]).encode()).hexdigest()[:16]
    return cache_root() / "native" / f"cpu_decode-{key}.so"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_file():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            result = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True,
                                    timeout=120, check=False)
            if result.returncode != 0:
                raise OSError(result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "compiler failed")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@cache
def native_decode() -> ctypes.CDLL | None:
    """The loaded library, or None (no compiler, a failed build, or MINISGL_NATIVE=0)."""
    if os.environ.get("MINISGL_NATIVE", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        log.info("no C compiler found: batch-1 decode on CPU runs as torch ops")
        return None
    target = _library_path(compiler)
    try:
        _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("could not build the CPU decode steps (%s): batch-1 decode runs as torch ops", exc)
        return None
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    return lib
