"""From a model name to a ready model: resolve where the weights live, read the config, check
the weights fit in memory, build our implementation and fill it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from .config import EngineConfig, ModelConfig
from .distributed import get_tp
from .errors import UserError, WeightsError
from .hf_config import builtin_config_names, load_hf_config, read_model_config
from .models import CausalLM, build_model

logger = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu")
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"unsupported --device {name!r}; use auto, cpu or cuda")
    return device


def resolve_dtype(name: str, device: torch.device, model_config: ModelConfig) -> torch.dtype:
    if name == "auto":
        if device.type == "cpu":
            return torch.float32
        return (
            DTYPES[model_config.dtype]
            if model_config.dtype in ("bfloat16", "float16")
            else torch.bfloat16
        )
    if name not in DTYPES:
        raise UserError(f"unsupported --dtype {name!r}; use auto, bfloat16, float16 or float32")
    return DTYPES[name]


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    return psutil.virtual_memory().available


# bytes a weight of a projection takes held each way on a GPU: 4- or 8-bit codes with a float16
# scale and offset per 32 (layers/quantized.py's GroupCodes); FP8 with a float32 scale per row
QUANTIZED_BYTES_PER_WEIGHT = {"int4": 0.5 + 4 / 32, "int8": 1 + 4 / 32, "fp8": 1.0}


def param_bytes(model_config: ModelConfig, dtype: torch.dtype, quantization: str = "none") -> int:
    """Bytes our model's parameters take, computed from the config alone; with ``quantization``
    (int4, int8, fp8) as a GPU holds them: the decoder's projections quantized (and an untied LM
    head too with int4 and int8), the embedding in ``dtype``."""
    c = model_config
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = (
        c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    )
    size = torch.empty((), dtype=dtype).element_size()
    projection = QUANTIZED_BYTES_PER_WEIGHT.get(quantization, size)
    table = c.vocab_size * c.hidden_size
    head = 0 if c.tie_word_embeddings else table
    head_size = projection if quantization in ("int4", "int8") else size
    return int(c.num_layers * per_layer * projection + table * size + head * head_size)


def check_fits(
    model_name: str,
    weight_bytes: int,
    kv_bytes_min: int,
    device: torch.device,
    dtype: torch.dtype,
    tp: int = 1,
    quantized: dict[str, int] | None = None,
) -> None:
    """Refuse a model whose share of weights and a minimal KV cache (``weight_bytes`` and
    ``kv_bytes_min`` are the whole model's; each of ``tp`` ranks holds about 1/tp) does not fit
    the device's free memory. On GPUs the message says which ``--quantization`` (of
    ``quantized``: each one's weight bytes) or --tp would fit."""
    free = free_memory_bytes(device)
    if (weight_bytes + kv_bytes_min) // tp <= free:
        return
    gib = 1 << 30
    share = "" if tp == 1 else f" (its 1/{tp} share with --tp {tp})"
    advice = "pick a smaller model or a smaller --dtype"
    fitting = [
        f"--quantization {kind} ({nbytes // tp / gib:.1f} GiB of weights)"
        for kind, nbytes in (quantized or {}).items()
        if (nbytes + kv_bytes_min) // tp <= free
    ]
    if fitting:
        advice = f"{' or '.join(fitting)} would fit it, or pick a smaller model"
    elif device.type == "cuda":
        fits = next(
            (n for n in (2, 4, 8, 16) if n > tp and (weight_bytes + kv_bytes_min) // n <= free),
            None,
        )
        if fits is not None:
            gpus = torch.cuda.device_count()
            have = f"this machine has {gpus}" if gpus < fits else "this machine has them"
            advice = f"--tp {fits} would fit it over {fits} GPUs ({have}), or pick a smaller model or --dtype"
    raise UserError(
        f"{model_name} needs {weight_bytes // tp / gib:.1f} GiB of weights in {str(dtype).removeprefix('torch.')} plus "
        f"{kv_bytes_min // tp / gib:.2f} GiB of KV cache{share}, but only {free / gib:.1f} GiB of {device.type} memory "
        f"is free; {advice}"
    )


@dataclass
class LoadedModel:
    model: CausalLM
    config: ModelConfig
    # None: the shape is read without transformers (a transformers model that needs its config
    # object, the benchmarks' reference, reads it with hf_config.load_hf_config)
    hf_config: object | None
    model_dir: Path | None
    device: torch.device
    dtype: torch.dtype
    quantization: str = "none"  # gguf | awq | gptq | int4 | int8 | fp8 | none (choose_quantization)
    weight_bytes: int = 0  # what the weights hold on their device (held_weight_bytes)


def held_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the weights hold on their device: the parameters with data, plus quantized
    weights' codes and scales (a tied CPU LM head's own copy included)."""
    held = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)
    held += sum(
        m.weight_scale.nbytes
        for m in model.modules()
        if getattr(m, "weight_scale", None) is not None
    )
    packed = [getattr(m, "quant", None) for m in model.modules()]
    packed.append(getattr(model, "tied_lm_head_packed", None))
    return held + sum(q.nbytes for q in packed if q is not None)


def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Random weights of the right shape: the same compute as the real model, no download."""
    device = next(
        model.parameters()
    ).device  # drawn where they live: an 8B model in seconds on a GPU
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        values = torch.randn(param.shape, generator=gen, device=device) * 0.02
        if name.endswith("norm.weight"):
            values = values + 1.0
        param.data.copy_(values)


def transpose_cpu_weights(model: CausalLM) -> None:
    """Every projection (and the LM head, tied or not) in the layout the CPU kernels prefer."""
    from .layers.linear import Linear, store_transposed

    for module in model.modules():
        if isinstance(module, Linear):
            store_transposed(module.weight)
    if model.lm_head is None:
        store_transposed(model.model.embed_tokens.weight)


@contextmanager
def one_thread_if(wanted: bool) -> Iterator[None]:
    """torch on one thread within the block (``wanted``): repacking a GGUF's blocks is thousands
    of small element-wise operations, where a second thread saves little on an idle machine and,
    with the other core busy, makes each operation wait for it (measured on 2 busy cores: the
    demo model's load took 11-18 s with two threads, 2-3 s with one)."""
    if not wanted:
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def return_freed_memory() -> None:
    """Freed buffers stay in the C allocator's arenas, still counted as resident (repacking the
    weights leaves ~150 MB of file copies and decoded codes; a long prefill, its activations);
    glibc's malloc_trim gives them back to the OS."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


QUANTIZATION_KINDS = ("auto", "none", "gguf", "int4", "int8", "fp8")
# what a checkpoint stores: "float", "gguf", "fp8", or a 4-bit "awq" / "gptq" checkpoint
ALREADY_QUANTIZED = {"gguf": "a GGUF file", "awq": "an AWQ checkpoint", "gptq": "a GPTQ checkpoint"}


def choose_quantization(config: EngineConfig, device: torch.device, stored: str = "float") -> str:
    """How the weights are held: "gguf" (a GGUF's blocks kept quantized: repacked for the CPU
    kernels, or for the GPU's group kernels), "awq" or "gptq" (a 4-bit checkpoint's codes kept
    for the same kernels), "int4" or "int8" (a float checkpoint quantized at load, for the same
    kernels), "fp8" (the decoder layers' projections in FP8, GPU), or "none" (every weight in
    the model dtype). ``stored``: what the checkpoint holds ("float", "gguf", "fp8", "awq",
    "gptq"). ``--quantization auto`` picks by that (``auto_quantization``); a kind asked for by
    name is checked against the device and the checkpoint."""
    kind = config.quantization
    if kind not in QUANTIZATION_KINDS:
        raise UserError(
            f"unsupported --quantization {kind!r}; use auto, none, gguf, int4, int8 or fp8 (GPU)"
        )
    if kind == "auto":
        return auto_quantization(device, stored)
    if kind == "none":
        return kind
    if kind == "fp8":
        from .layers.fp8 import fp8_unavailable_reason

        reason = fp8_unavailable_reason(device)
        if reason is not None:
            raise UserError(
                f"--quantization fp8: {reason}; use int8 or int4 on CPU, or --quantization none"
            )
        return kind
    if kind == "gguf" and stored != "gguf":
        raise UserError(
            "--quantization gguf keeps a GGUF file's quantized blocks, and this model is no "
            "GGUF; use int4, int8 or fp8 to quantize it at load"
        )
    reason = group_kernels_unavailable_reason(device)
    if reason is not None:
        raise UserError(f"--quantization {kind}: {reason}; use --quantization none")
    if kind in ("int4", "int8") and stored in ALREADY_QUANTIZED:
        raise UserError(
            f"--quantization {kind} quantizes a float checkpoint; {ALREADY_QUANTIZED[stored]} is "
            "already quantized (use --quantization auto to keep its codes, or none)"
        )
    return kind


def auto_quantization(device: torch.device, stored: str) -> str:
    """``--quantization auto``: a checkpoint stored in FP8 stays in FP8 where the GPU has FP8
    tensor cores; a 4-bit AWQ/GPTQ checkpoint keeps its codes wherever our group kernels run
    (else it is widened, as the log says); a GGUF keeps its blocks on a CPU (on a GPU it is
    widened: the 16-bit path's fused kernels are faster for small models, and the fit check
    names --quantization gguf where only that fits); everything else is held in the model
    dtype."""
    if stored == "fp8":
        from .layers.fp8 import fp8_unavailable_reason

        if fp8_unavailable_reason(device) is None:
            return "fp8"
    groups_unavailable = group_kernels_unavailable_reason(device)
    if stored in ("awq", "gptq"):
        if groups_unavailable is None:
            return stored
        logger.info(
            "%s checkpoint widened to the model dtype: %s", stored.upper(), groups_unavailable
        )
    if stored == "gguf" and device.type == "cpu" and groups_unavailable is None:
        return "gguf"
    return "none"


def group_kernels_unavailable_reason(device: torch.device) -> str | None:
    """Why 4- and 8-bit weights cannot be kept quantized on ``device`` (None: they can): our
    kernels take one rank, on CPU torch's packed kernel (or our C kernels), on a GPU Triton."""
    if get_tp().size > 1:
        return "quantized weights run with one rank (no --tp)"
    if device.type == "cuda":
        from .kernels.flashinfer_kernels import triton_unavailable_reason

        reason = triton_unavailable_reason()
        return None if reason is None else f"the GPU's 4-bit kernels need Triton ({reason})"
    from .layers.quantized import packed_kernels_available

    if device.type != "cpu" or not packed_kernels_available():
        return "this torch build or device has no packed 4-bit kernel"
    return None


def log_int4_holding(model: torch.nn.Module, method: str) -> None:
    """Say how an AWQ/GPTQ checkpoint's matrices are held: as 4-bit group codes, or widened
    (where the group kernels do not take the shape)."""
    held = sum(1 for module in model.model.layers.modules() if getattr(module, "quant", None))
    widened = (
        sum(1 for name, p in model.model.layers.named_parameters() if name.endswith("proj.weight"))
        - held
    )
    logger.info("%s matrices: %d in 4-bit group codes, %d widened", method.upper(), held, widened)


def model_folder(config: EngineConfig) -> Path | None:
    """The model's folder (resolved, downloaded or converted); None for random weights of a
    built-in config."""
    if config.dummy_weights and config.config is not None:
        return None
    if config.dummy_weights and config.model is None:
        raise UserError(
            "--dummy-weights needs --config NAME (or a --model folder for its config.json)"
        )
    from .weights.source import resolve_model

    return resolve_model(config.model)


def check_model_fits(
    config: EngineConfig,
    model_config: ModelConfig,
    name: str,
    weight_bytes: int,
    device: torch.device,
    dtype: torch.dtype,
    gguf_kept_bytes: int | None = None,
) -> None:
    """The weights and a KV cache of up to 4,096 tokens fit the device, or a UserError says so
    (on a GPU, with the --quantization that would fit: for a GGUF widened, keeping its blocks,
    about ``gguf_kept_bytes``)."""
    from .kvcache.kv_pool import KVPool, resolve_kv_dtype

    kv_dtype = resolve_kv_dtype(config.kv_dtype, dtype, device.type)
    per_token = KVPool.bytes_per_token(
        model_config.num_layers, model_config.num_kv_heads, model_config.head_dim, kv_dtype
    )
    tp = get_tp().size  # each rank holds about 1/tp of the weights and of the KV heads
    quantized = {}
    if device.type == "cuda" and config.quantization in ("auto", "none") and weight_bytes:
        from .layers.fp8 import fp8_unavailable_reason

        kinds = ["fp8"] if fp8_unavailable_reason(device) is None else []
        groups = group_kernels_unavailable_reason(device) is None
        if groups and gguf_kept_bytes is None:
            kinds += ["int8", "int4"]
        quantized = {kind: param_bytes(model_config, dtype, kind) for kind in kinds}
        if groups and gguf_kept_bytes is not None:
            quantized["gguf"] = gguf_kept_bytes
    check_fits(
        name,
        weight_bytes,
        per_token * min(model_config.max_context_len, 4096),
        device,
        dtype,
        tp,
        quantized,
    )


def move_to(model: torch.nn.Module, device: torch.device) -> None:
    """Every parameter and buffer with data onto ``device``, in place (the parameter objects
    and what they carry stay; placeholders of quantized weights stay on "meta")."""
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if not param.is_meta and param.device != device:
                param.data = param.data.to(device)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.device != device:
                setattr(module, name, buffer.to(device))


def load_model(config: EngineConfig, kv_bytes_min_per_token: int = 0) -> LoadedModel:
    from .weights.fp8_checkpoint import fp8_checkpoint_format, read_fp8_checkpoint
    from .weights.gguf_tensors import GGUF_WEIGHTS, iter_gguf
    from .weights.int4_checkpoint import read_int4_checkpoint
    from .weights.int4_config import int4_checkpoint_format
    from .weights.safetensors_io import iter_safetensors, weights_nbytes

    model_dir = model_folder(config)
    model_config = read_model_config(config, model_dir)  # transformers only where needed
    device = resolve_device(config.device)
    if (
        device.type == "cuda" and device.index is not None
    ):  # plain "cuda": the current device already
        # Triton and FlashInfer launch on the current device, cuda:0 until set: an engine on
        # cuda:1 (a --dp replica, a tensor-parallel rank, LLM(device="cuda:1")) would run its
        # kernels on GPU 0 with pointers into GPU 1
        torch.cuda.set_device(device)
    dtype = resolve_dtype(config.dtype, device, model_config)
    name = config.config or str(config.model or "the demo model")
    gguf_file = (
        model_dir / GGUF_WEIGHTS if model_dir is not None and not config.dummy_weights else None
    )
    if gguf_file is not None and not gguf_file.is_file():
        gguf_file = None
    fp8_layout = int4_layout = None
    if gguf_file is None and not config.dummy_weights:
        fp8_layout = fp8_checkpoint_format(model_dir)
        int4_layout = int4_checkpoint_format(model_dir)  # an unsupported variant: WeightsError
    stored = "gguf" if gguf_file is not None else "float"  # what the checkpoint holds
    if fp8_layout is not None:
        stored = "fp8"
    if int4_layout is not None:
        stored = int4_layout.method
    quantization = choose_quantization(config, device, stored)
    # Quantized at load on a GPU: the checkpoint is read into host memory and each matrix goes
    # to the GPU quantized, so only the quantized weights need to fit there (random weights are
    # drawn on the GPU, in the model's dtype first)
    staged = device.type == "cuda" and quantization != "none" and not config.dummy_weights
    if config.dummy_weights:
        weight_bytes = param_bytes(model_config, dtype)
    elif staged and quantization in QUANTIZED_BYTES_PER_WEIGHT:
        weight_bytes = param_bytes(model_config, dtype, quantization)
    elif staged and int4_layout is not None and quantization == int4_layout.method:
        weight_bytes = param_bytes(model_config, dtype, "int4")  # int4_checkpoint_planes
    else:
        weight_bytes = weights_nbytes(model_dir, dtype, keep_gguf_blocks=quantization == "gguf")
    gguf_kept_bytes = None
    if gguf_file is not None and quantization == "none" and device.type == "cuda":
        gguf_kept_bytes = weights_nbytes(model_dir, dtype, keep_gguf_blocks=True)
    check_model_fits(config, model_config, name, weight_bytes, device, dtype, gguf_kept_bytes)

    with torch.device("cpu" if staged else device):
        default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = build_model(model_config, dtype)
        finally:
            torch.set_default_dtype(default_dtype)
    if config.dummy_weights:
        init_dummy_weights(model, config.seed)
    else:
        logger.info("loading weights from %s", model_dir)
        if gguf_file is not None:
            with one_thread_if(quantization == "gguf" and device.type == "cpu"):
                model.load_weights(
                    iter_gguf(gguf_file), keep_quantized=quantization == "gguf", quantize_on=device
                )
        else:
            # with tensor parallelism each rank reads only its slices of the checkpoint
            weights = iter_safetensors(model_dir, lazy=get_tp().size > 1)
            if fp8_layout is not None:
                # per-channel codes are our FP8 form: held as stored where we hold FP8
                keep = quantization == "fp8" and fp8_layout.kind == "channel"
                logger.info(
                    "weights stored in FP8 (%s scales): %s",
                    fp8_layout.kind,
                    "held as stored" if keep else "widened as read",
                )
                weights = read_fp8_checkpoint(weights, fp8_layout, keep_channel_codes=keep)
            if int4_layout is not None:
                keep = quantization == int4_layout.method
                logger.info(
                    "weights stored as %s 4-bit codes: %s",
                    int4_layout.method.upper(),
                    "held as group codes" if keep else "widened as read",
                )
                weights = read_int4_checkpoint(weights, int4_layout)
            model.load_weights(
                weights, keep_quantized=quantization in ("awq", "gptq"), quantize_on=device
            )
    if int4_layout is not None and quantization == int4_layout.method:
        log_int4_holding(model, quantization)
    if quantization in ("int4", "int8"):
        model.quantize(quantization, device)
    if quantization == "fp8":
        from .layers.fp8 import scaled_mm_works

        saved = model.quantize_fp8(device)
        torch.cuda.empty_cache()  # the 16-bit copies' memory back for the KV cache
        logger.info(
            "FP8 weights: %.2f GiB saved; products of several rows on %s",
            saved / 2**30,
            "the FP8 tensor cores" if scaled_mm_works(device) else "weights widened per product",
        )
    if staged:
        move_to(model, device)
    if device.type == "cuda" and quantization in ("gguf", "awq", "gptq", "int4", "int8"):
        from .layers.quantized_gpu import check_group_kernels

        turned_off = check_group_kernels(device, dtype)
        if turned_off:
            logger.warning(
                "the %s group kernel(s) turned off: those products widen the weight (slower)",
                " and ".join(turned_off),
            )
    if quantization != "none":
        return_freed_memory()
    model.eval()
    if device.type == "cpu" and dtype == torch.float32:
        transpose_cpu_weights(model)
    held = held_weight_bytes(model)
    logger.info("weights: %.2f GiB on %s (quantization: %s)", held / 2**30, device, quantization)
    return LoadedModel(model, model_config, None, model_dir, device, dtype, quantization, held)


__all__ = ["LoadedModel", "WeightsError", "builtin_config_names", "load_hf_config", "load_model"]
