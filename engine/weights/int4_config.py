"""Which 4-bit Hugging Face checkpoint a folder holds (AWQ or GPTQ), read from config.json's
``quantization_config`` (or an old GPTQ export's quantize_config.json), and whether we can load
it. Light (no torch): the front end checks a folder with it before any worker starts, so an
unsupported checkpoint is one line and exit code 2 instead of a worker's failure.

What we load (weights/int4_checkpoint.py unpacks it): 4-bit codes with a float16 scale and an
integer zero point per group of inputs, ``weight = (code - zero) * scale``, groups of a
multiple of 32 inputs (or one group per row) laid out in input order:

- AWQ, version "gemm" (AutoAWQ's default export);
- GPTQ in its historical format (``checkpoint_format`` "gptq": each zero point stored minus
  one) or GPTQModel's "gptq_v2" (stored as is), symmetric or not, without act-order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import WeightsError

WHAT_LOADS = (
    "use a 4-bit AWQ (gemm) or GPTQ export, a float checkpoint with --quantization int4, or a GGUF"
)


@dataclass(frozen=True)
class Int4Checkpoint:
    """``method`` "awq" or "gptq"; ``group_size`` inputs per scale (-1: one group per row);
    ``symmetric`` every zero point is 8 (GPTQ's sym); ``zero_offset`` what to add to each
    stored zero point (1 for GPTQ's historical format)."""

    method: str
    group_size: int
    symmetric: bool = False
    zero_offset: int = 0


def read_quantization_config(model_dir: Path) -> dict | None:
    """config.json's ``quantization_config`` (else an old GPTQ export's quantize_config.json,
    with ``quant_method`` "gptq"); None for a folder without one."""
    for name in ("config.json", "quantize_config.json"):
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if name == "config.json":
            quant = data.get("quantization_config")
            if isinstance(quant, dict):
                return quant
        elif "bits" in data:
            return {"quant_method": "gptq", **data}
    return None


def int4_checkpoint_format(model_dir: Path | None) -> Int4Checkpoint | None:
    """The AWQ or GPTQ layout of the checkpoint in ``model_dir``; None for any other kind.
    A WeightsError (one line, saying what to use) for an AWQ or GPTQ variant we cannot hold."""
    if model_dir is None:
        return None
    quant = read_quantization_config(Path(model_dir))
    method = str((quant or {}).get("quant_method", "")).lower()
    if method not in ("awq", "gptq"):
        return None
    name = method.upper()
    bits = quant.get("bits", quant.get("w_bit"))
    if bits != 4:
        raise WeightsError(
            f"this {name} checkpoint stores {bits}-bit weights (bits: {bits} in its "
            f"quantization_config) and only 4-bit ones load; {WHAT_LOADS}"
        )
    group = quant.get("group_size", quant.get("q_group_size", 128))
    if not isinstance(group, int) or not (group == -1 or (group > 0 and group % 32 == 0)):
        raise WeightsError(
            f"this {name} checkpoint's group_size is {group}; our 4-bit kernels take groups of "
            f"a multiple of 32 inputs (or -1, one per row); {WHAT_LOADS}"
        )
    if method == "awq":
        # AutoAWQ writes "version"; GPTQModel's AWQ exports "format"
        version = str(quant.get("version", quant.get("format", "gemm"))).lower()
        if version != "gemm":
            raise WeightsError(
                f"this AWQ checkpoint is packed for the {version!r} kernels (version in its "
                f"quantization_config) and only the 'gemm' packing loads; {WHAT_LOADS}"
            )
        if quant.get("zero_point", True) is False:
            raise WeightsError(
                "this AWQ checkpoint has no zero points (zero_point: false in its "
                f"quantization_config), which the 'gemm' packing does not store; {WHAT_LOADS}"
            )
        return Int4Checkpoint("awq", group)
    if quant.get("desc_act"):
        raise WeightsError(
            "this GPTQ checkpoint uses act-order (desc_act: true in its quantization_config): its "
            "groups gather inputs from all over each row, and our 4-bit kernels need each group's "
            f"inputs side by side; use a GPTQ export with desc_act false, or {WHAT_LOADS[4:]}"
        )
    fmt = str(quant.get("checkpoint_format", quant.get("format", "gptq"))).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise WeightsError(
            f"this GPTQ checkpoint is stored as {fmt!r} (checkpoint_format in its "
            f"quantization_config); 'gptq' and 'gptq_v2' load; {WHAT_LOADS}"
        )
    symmetric = bool(quant.get("sym", True))
    return Int4Checkpoint("gptq", group, symmetric, zero_offset=1 if fmt == "gptq" else 0)
