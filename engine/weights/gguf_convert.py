"""A GGUF file made into a Hugging Face-style folder, once.

The engine reads the weights from the GGUF file itself (weights/gguf_tensors.py), quantized blocks
as they are; what it needs beside them is written once with transformers' own GGUF reader:
config.json (without ``quantization_config``), the tokenizer files and generation_config.json. The
file goes into the folder as ``model.gguf`` (a hard link where possible).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock

from ..errors import ModelSourceError
from .layout import GGUF_WEIGHTS

log = logging.getLogger(__name__)

COMPLETE_MARKER = ".complete"
_TMP_PREFIX = ".tmp-"


# what a finished folder holds; folders of an older layout (the weights widened to float32 in
# model.safetensors) are made again, so that the weights stay quantized
LAYOUT = "gguf-weights"


def is_complete(folder: Path) -> bool:
    """True once a conversion of the current layout finished: the marker is the last file written."""
    try:
        marker = json.loads((Path(folder) / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("layout") == LAYOUT


@contextmanager
def _transformers_progress(enabled: bool, bars: type | None = None):
    """Turn transformers' tqdm bars off for the duration when ``enabled`` is False, or draw its
    GGUF bars with ``bars`` (a tqdm subclass).

    That bar is a bare ``tqdm`` that ignores transformers' switch, so its module's ``tqdm`` is
    swapped while we run.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    if enabled:
        original = getattr(gguf_utils, "tqdm", None)
        if bars is not None and original is not None:
            gguf_utils.tqdm = bars
        try:
            yield
        finally:
            if bars is not None and original is not None:
                gguf_utils.tqdm = original
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    original = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if original is not None:
        gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original
        if was_enabled:
            hf_logging.enable_progress_bar()


def _plain_config(hf_config) -> dict:
    """The config as a normal checkpoint would have it: no GGUF quantization_config, the
    architecture named, and rope_theta also at the top level, where transformers 4.x and most
    hub configs keep it (5.x nests it in rope_parameters)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = {k: v for k, v in hf_config.to_dict().items() if not k.startswith("_")}
    config.pop("quantization_config", None)
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if architecture is not None:
        config["architectures"] = [architecture]
    config["dtype"] = "float32"  # what the blocks widen to; a GPU picks its 16-bit type itself
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
    return config


def _portable_tokenizer_class(path: Path) -> None:
    """transformers 5 saves ``TokenizersBackend``, a class 4.x lacks; both know the fast-tokenizer
    name, which 5.x maps to the same class."""
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("tokenizer_class") == "TokenizersBackend":
        data["tokenizer_class"] = "PreTrainedTokenizerFast"
        path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _place_gguf(gguf_path: Path, target: Path) -> None:
    """The weights stay in the GGUF file: a hard link where the file system allows it (no second
    copy on disk), else a copy."""
    try:
        os.link(gguf_path, target)
    except OSError:
        shutil.copyfile(gguf_path, target)


def _write_folder(gguf_path: Path, out: Path, progress: bool, bars: type | None) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        with _transformers_progress(progress, bars):
            hf_config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as exc:  # transformers raises many kinds for unsupported/corrupt GGUF
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelSourceError(
            f"could not read GGUF file {gguf_path} with transformers "
            f"({type(exc).__name__}: {first}); use a GGUF of a supported "
            "architecture or a Hugging Face folder"
        ) from exc

    config = _plain_config(hf_config)
    (out / "config.json").write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    tokenizer.save_pretrained(str(out))
    _portable_tokenizer_class(out / "tokenizer_config.json")
    generation = GenerationConfig.from_model_config(hf_config)
    generation.save_pretrained(str(out))
    _place_gguf(gguf_path, out / GGUF_WEIGHTS)


def convert_gguf(
    gguf_path: Path, out_dir: Path, progress: bool = True, bars: type | None = None
) -> Path:
    """Dequantise ``gguf_path`` into ``out_dir`` once; later calls return at once.

    The folder is built in a temporary sibling and renamed into place, so an interrupted run never
    leaves a half-written ``out_dir`` behind; a file lock serialises concurrent conversions.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if is_complete(out_dir):
        return out_dir
    if not gguf_path.is_file():
        raise ModelSourceError(f"GGUF file {gguf_path} does not exist; check the path")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir.parent / f"{out_dir.name}.lock")):
        if is_complete(out_dir):
            return out_dir
        # Leftovers of runs that were killed: nobody else can be using them while we hold the lock.
        for stale in out_dir.parent.glob(f"{_TMP_PREFIX}{out_dir.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{out_dir.name}-", dir=out_dir.parent))
        try:
            start = time.monotonic()
            log.info("converting %s into %s (one time only)", gguf_path, out_dir)
            _write_folder(gguf_path, tmp, progress, bars)
            marker = {
                "layout": LAYOUT,
                "source": gguf_path.name,
                "seconds": round(time.monotonic() - start, 1),
            }
            (tmp / COMPLETE_MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")
            if out_dir.exists():  # an incomplete folder from elsewhere; never used as is
                shutil.rmtree(out_dir)
            os.replace(tmp, out_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
