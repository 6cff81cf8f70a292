"""Turning the user's ``--model`` into a local Hugging Face folder.

Accepted: nothing or "demo" (the built-in model), a local folder, a ``.gguf`` file (converted
once into the cache), or a hub id such as ``Qwen/Qwen3-0.6B`` (downloaded and cached by
huggingface_hub, which also honours HF_HUB_CACHE and HF_HUB_OFFLINE).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

from ..errors import ModelSourceError
from .demo import cache_root, pull_demo
from .gguf_convert import convert_gguf
from .layout import INDEX_FILE, SINGLE_FILE

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.txt", "*.model", "*.jinja"]
_PATH_PREFIXES = ("/", "./", "../", "~", ".\\", "..\\")


def _gguf_cache_dir(gguf: Path) -> Path:
    """A cache folder keyed by the file's identity, so an edited file is converted again."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return cache_root() / "models" / f"gguf-{key.hexdigest()[:16]}"


def _from_gguf(model: str, progress: bool, bars: type | None) -> Path:
    gguf = Path(model).expanduser()
    if not gguf.is_file():
        raise ModelSourceError(f"GGUF file {model} does not exist; check the path")
    return convert_gguf(gguf, _gguf_cache_dir(gguf), progress, bars)


def _from_folder(folder: Path, model: str) -> Path:
    if not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"{model} is not a Hugging Face model folder (no config.json); "
            "pass a folder with config.json and safetensors weights"
        )
    return folder.resolve()


@contextmanager
def _hub_progress(enabled: bool):
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    if not enabled and not was_disabled:
        disable_progress_bars()
    try:
        yield
    finally:
        if not enabled and not was_disabled:
            enable_progress_bars()


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _network_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's base error: httpx2 in huggingface_hub 2.x, httpx in 1.x."""
    errors: list[type[BaseException]] = [OSError]
    for name in ("httpx2", "httpx"):
        try:
            errors.append(__import__(name).HTTPError)
        except (ImportError, AttributeError):
            pass
    return tuple(errors)


def _download(repo_id: str, progress: bool, bars: type | None) -> Path:
    """The hub's snapshot of ``repo_id`` (from the cache when it is there); each way the download
    can fail is a sentence saying what to do."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = constants.HF_HUB_CACHE
    try:
        with _hub_progress(progress):
            return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, tqdm_class=bars))
    except HFValidationError as exc:
        raise ModelSourceError(
            f"{repo_id!r} is neither an existing path nor a valid Hugging Face "
            "model id (org/name); check the spelling"
        ) from exc
    except GatedRepoError as exc:
        raise ModelSourceError(
            f"model {repo_id!r} is gated on the Hugging Face Hub; accept its "
            "terms on huggingface.co and log in with `hf auth login`"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelSourceError(
            f"model {repo_id!r} was not found on the Hugging Face Hub (or is "
            "private); check the id or log in with `hf auth login`"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelSourceError(
            f"model {repo_id!r} has no such revision on the Hugging Face Hub; check the id"
        ) from exc
    except IncompleteSnapshotError as exc:
        raise ModelSourceError(
            f"the cached copy of model {repo_id!r} (HF_HUB_CACHE={cache}) is "
            "incomplete and the hub cannot be reached; finish the download "
            "with network access or pass a local folder"
        ) from exc
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(
            f"model {repo_id!r} is not in the Hugging Face cache "
            f"(HF_HUB_CACHE={cache}) and the hub cannot be reached; download "
            "it once with network access or pass a local folder"
        ) from exc
    except (HfHubHTTPError, *_network_errors()) as exc:
        raise ModelSourceError(
            f"downloading model {repo_id!r} from the Hugging Face Hub failed "
            f"({type(exc).__name__}: {_first_line(exc)}); check the network "
            "and disk space, or pass a local folder"
        ) from exc


def _from_hub(repo_id: str, progress: bool, bars: type | None) -> Path:
    folder = _download(repo_id, progress, bars)
    if not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"model {repo_id!r} has no config.json (a GGUF-only repository?); "
            "download its .gguf file and pass that path instead"
        )
    if not ((folder / SINGLE_FILE).is_file() or (folder / INDEX_FILE).is_file()):
        raise ModelSourceError(
            f"model {repo_id!r} has no safetensors weights; pick a repository "
            "that ships model.safetensors"
        )
    return folder


def resolve_model(model: str | None, *, progress: bool = True, bars: type | None = None) -> Path:
    """A local folder with config.json, safetensors weights and the tokenizer for ``model``.

    ``progress`` draws tqdm's bars on stderr; ``bars``, a tqdm subclass, draws them instead (the
    chat page's pull reads a child process's progress through one)."""
    if model is None or model.strip() in ("", "demo"):
        return pull_demo(progress)
    model = model.strip()
    if model.lower().endswith(".gguf"):
        return _from_gguf(model, progress, bars)
    path = Path(model).expanduser()
    if path.is_dir():
        return _from_folder(path, model)
    if path.exists():
        raise ModelSourceError(
            f"{model} is a file, not a model folder or .gguf file; pass a "
            "Hugging Face folder, a .gguf file or a hub id"
        )
    if model.startswith(_PATH_PREFIXES) or model in (".", ".."):
        raise ModelSourceError(f"model path {model} does not exist; check the path")
    return _from_hub(model, progress, bars)
