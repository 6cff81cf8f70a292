"""The files a model folder keeps its weights in: their names, and which of them a folder has.
Light (no torch), so the front end can check a folder before any worker starts."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import WeightsError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
GGUF_WEIGHTS = "model.gguf"  # a converted GGUF folder's file (gguf_convert.py)


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of ``model_dir``, each once, in index order (checks they exist)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise WeightsError(f"model folder {model_dir} does not exist; pass an existing folder")
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = list(dict.fromkeys(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WeightsError(
                f"{index} is not a valid safetensors index ({type(exc).__name__}); "
                "download the model again"
            ) from exc
        files = [model_dir / name for name in names]
        for file in files:
            if not file.is_file():
                raise WeightsError(
                    f"shard {file} listed in {index.name} is missing; download the model again"
                )
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    raise WeightsError(
        f"no {SINGLE_FILE} or {INDEX_FILE} in {model_dir}; "
        "the model needs weights in safetensors format"
    )
