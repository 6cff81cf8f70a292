"""The models already on this machine, for the chat page's models panel: the demo model, hub
ids in the Hugging Face cache, and GGUF files converted into our cache. Each is described from
its config.json and the sizes of its weight files; nothing is downloaded, no weight is read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .demo import DEMO_MODEL_NAME, cache_root, demo_model_dir
from .gguf_convert import COMPLETE_MARKER, is_complete
from .layout import GGUF_WEIGHTS, weight_files

WEIGHT_SUFFIXES = (".safetensors", ".gguf")  # what a model folder's size counts


@dataclass(frozen=True)
class LocalModel:
    """One model that can be served without a download.

    ``name``: what /v1/models lists once it is served (the hub id, the .gguf file's name, or the
    demo's name); ``model``: what ``--model`` takes to load it (a folder, or "demo")."""

    name: str
    model: str
    kind: str  # "demo", "hub" (Hugging Face cache) or "gguf" (converted into our cache)
    folder: Path
    size_bytes: int
    architecture: str | None  # config.json's architectures[0] (else its model_type)
    model_type: str | None
    context_len: int | None  # config.json's max_position_embeddings


def describe_folder(folder: Path, name: str, model: str, kind: str) -> LocalModel | None:
    """A model folder's entry, or None when it has no readable config.json."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    archs = config.get("architectures")
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    architecture = (
        archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else model_type
    )
    context = config.get("max_position_embeddings")
    size = 0
    for file in folder.iterdir():
        if file.name.endswith(WEIGHT_SUFFIXES):
            try:
                size += file.stat().st_size  # the hub cache's symlinks: the blob's size
            except OSError:
                pass
    return LocalModel(
        name,
        model,
        kind,
        folder,
        size,
        architecture,
        model_type,
        context if isinstance(context, int) else None,
    )


def has_weights(folder: Path) -> bool:
    if (folder / GGUF_WEIGHTS).is_file():
        return True
    try:
        weight_files(folder)
    except Exception:  # noqa: BLE001 (WeightsError, or an unreadable folder)
        return False
    return True


def hub_cache_dir() -> Path:
    """huggingface_hub's cache folder (HF_HUB_CACHE, HF_HOME, or ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def hub_snapshot(repo_folder: Path) -> Path | None:
    """The snapshot ``refs/main`` points at, else the newest one."""
    snapshots = repo_folder / "snapshots"
    try:
        ref = (repo_folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        ref = ""
    if ref and (snapshots / ref).is_dir():
        return snapshots / ref
    try:
        found = [p for p in snapshots.iterdir() if p.is_dir()]
    except OSError:
        return None
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def hub_models(cache: Path) -> list[LocalModel]:
    """Hub ids in the Hugging Face cache (folders ``models--org--name``) that hold a config.json
    and all their weight files: a download cut short (a cancelled pull) is not a model yet."""
    out = []
    try:
        repos = sorted(p for p in cache.iterdir() if p.name.startswith("models--") and p.is_dir())
    except OSError:
        return []
    for repo in repos:
        repo_id = repo.name.removeprefix("models--").replace("--", "/")
        snapshot = hub_snapshot(repo)
        if snapshot is None or not has_weights(snapshot):
            continue
        if (entry := describe_folder(snapshot, repo_id, str(snapshot), "hub")) is not None:
            out.append(entry)
    return out


def gguf_models(models_dir: Path) -> list[LocalModel]:
    """GGUF files converted into our cache (``gguf-<key>`` folders), named after their file."""
    out = []
    try:
        folders = sorted(
            p for p in models_dir.iterdir() if p.name.startswith("gguf-") and is_complete(p)
        )
    except OSError:
        return []
    for folder in folders:
        try:
            source = (
                json.loads((folder / COMPLETE_MARKER).read_text(encoding="utf-8")).get("source")
                or folder.name
            )
        except (OSError, ValueError, AttributeError):
            source = folder.name
        entry = describe_folder(folder, str(source).removesuffix(".gguf"), str(folder), "gguf")
        if entry is not None:
            out.append(entry)
    return out


def local_models() -> list[LocalModel]:
    """Every model on this machine that can be served without a download: the demo model (once
    pulled), then the Hugging Face cache's hub ids, then converted GGUF files."""
    out = []
    if (
        is_complete(demo_model_dir())
        and (demo := describe_folder(demo_model_dir(), DEMO_MODEL_NAME, "demo", "demo")) is not None
    ):
        out.append(demo)
    out += hub_models(hub_cache_dir())
    out += gguf_models(cache_root() / "models")
    return out
