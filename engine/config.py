"""Frozen configuration built once: the model's shape (from its Hugging Face config) and the
engine's settings (from the CLI or the Python API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ModelSourceError

# model_type in config.json -> our model family (engine/models/<family>.py)
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


@dataclass(frozen=True)
class ModelConfig:
    """The numbers our model code needs, independent of the transformers version that read them."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None  # llama3-style parameters, None for plain RoPE
    max_context_len: int
    tie_word_embeddings: bool
    attention_bias: bool  # Qwen2: bias on q/k/v projections
    qk_norm: bool  # Qwen3: RMSNorm on each head of q and k
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "float32"  # the checkpoint's own dtype (a torch dtype name)

    @property
    def attention_cost_per_position(self) -> float:
        """How much more a prompt token costs to read for each token before it, relative to its
        cost with none before it: attention's multiply-adds over the positions before it (scores
        and values, every query head) against those of the layer's weights. SmolLM2-135M: ~3.3e-4,
        so the 4,000th token costs ~2.3 times the first (measured on CPU: 2.2-2.5x per chunk)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        weights = self.hidden_size * (2 * q + 2 * kv + 3 * self.intermediate_size)
        return 2 * q / weights

    @classmethod
    def from_hf(cls, hf_config: Any) -> ModelConfig:
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            supported = ", ".join(sorted(SUPPORTED_MODEL_TYPES))
            raise ModelSourceError(
                f"unsupported model architecture {model_type!r}; supported: {supported}"
            )
        num_heads = hf_config.num_attention_heads
        head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads
        # transformers 5 keeps theta and scaling in `rope_parameters`; 4.x in two attributes.
        rope = dict(getattr(hf_config, "rope_parameters", None) or {})
        if not rope:
            rope = dict(getattr(hf_config, "rope_scaling", None) or {})
            rope.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ModelSourceError(
                f"unsupported RoPE scaling {rope_type!r} (supported: default, llama3)"
            )
        max_context = hf_config.max_position_embeddings
        # We attend to the whole sequence; a sliding-window model is exact only within its window.
        window = getattr(hf_config, "sliding_window", None)
        if window and (model_type == "mistral" or getattr(hf_config, "use_sliding_window", False)):
            max_context = min(max_context, window)
        eos = getattr(hf_config, "eos_token_id", None)
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
        dtype = (
            getattr(hf_config, "dtype", None)
            or getattr(hf_config, "torch_dtype", None)
            or "float32"
        )
        dtype = str(dtype).removeprefix("torch.")
        return cls(
            model_type=model_type,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            rope_scaling=rope if rope_type == "llama3" else None,
            max_context_len=max_context,
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2"
            or bool(getattr(hf_config, "attention_bias", False)),
            qk_norm=model_type == "qwen3",
            eos_token_ids=eos_ids,
            dtype=dtype,
        )

    @property
    def family(self) -> str:
        return SUPPORTED_MODEL_TYPES[self.model_type]


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings; every field is a CLI flag of the same name."""

    model: str | None = None  # local folder, hub id, .gguf file; None = the built-in demo model
    tokenizer: str | None = None  # take the tokenizer from another folder
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    # auto: a GGUF's quantized weights stay quantized on CPU (layers/quantized.py), others as stored;
    # none: every weight widened to --dtype; int4 | int8: quantize a float checkpoint at load (CPU)
    quantization: str = "auto"
    dummy_weights: bool = False  # random weights, never downloads anything
    config: str | None = None  # built-in config name for --dummy-weights (e.g. qwen3-0.6b)
    page_size: int = 0  # tokens per KV page; 0 = by device (engine.default_page_size)
    # auto (float16 on CPU, the model's dtype on a GPU) | fp8 (e4m3: half of 16 bits, less precise) |
    # float16 | bfloat16 | float32 (CPU); kvcache/kv_pool.py
    kv_dtype: str = "auto"
    max_kv_tokens: int | None = None  # None = sized from free memory
    mem_fraction: float = 0.85  # share of free memory the KV pool may take when sized from memory
    max_running_requests: int = 64
    max_prefill_tokens: int | None = (
        None  # token budget of one prefill batch (longer prompts are chunked); None = by device
    )
    cache: str = "radix"  # radix (prefix cache) | naive (no sharing)
    attn: str = "auto"  # auto | flashinfer | torch
    cuda_graph_max_bs: int = 256  # decode batches up to this size replay CUDA graphs; 0 = never
    overlap: bool = True  # on CUDA, schedule step N+1 while the GPU runs step N
    fused_kernels: bool = True  # on CUDA, Triton kernels where they beat the unfused path
    seed: int = 0  # seed for random dummy weights
    cpu_threads: int = 0  # CPU path: compute threads; 0 = the cores other processes leave free (re-checked while running)
    tp: int = 1  # tensor-parallel ranks (all machines together)
    dp: int = 1  # data-parallel replicas of the whole engine, tp GPUs each, behind one front end
    dp_routing: str = (
        "prefix"  # prefix (the replica holding the longest cached prefix) | round-robin
    )
    nnodes: int = 1  # machines the ranks are spread over (serve / chat only)
    node_rank: int = 0  # which of them this is; 0 runs the front end
    dist_init_addr: str | None = None  # HOST:PORT where rank 0 meets the others (nnodes > 1)


def check_parallel(
    tp: int, dp: int = 1, nnodes: int = 1, node_rank: int = 0, dist_init_addr: str | None = None
) -> None:
    """The --tp, --dp and multi-machine flags must describe one consistent group. (Here, away
    from torch: a wrong flag is said in a moment, before the engine's imports.)"""
    from .errors import UserError

    if tp < 1 or dp < 1:
        raise UserError(f"--tp and --dp must be at least 1 (got --tp {tp}, --dp {dp})")
    if dp > 1 and (nnodes > 1 or dist_init_addr):
        raise UserError(
            "--dp runs its replicas on this machine only (each picks its own rendezvous); use it without --nnodes "
            "and --dist-init-addr"
        )
    if nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UserError(
            f"--node-rank must be in [0, --nnodes) and --nnodes >= 1 (got {node_rank} of {nnodes})"
        )
    if tp % nnodes:
        raise UserError(f"--tp {tp} ranks cannot be spread evenly over --nnodes {nnodes} machines")
    if nnodes > 1:
        host, _, port = (dist_init_addr or "").rpartition(":")
        if not host or not port.isdigit():
            raise UserError(
                f"--nnodes {nnodes} needs --dist-init-addr HOST:PORT (an address of node 0 the others can reach)"
            )
