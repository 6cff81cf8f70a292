"""Write tests/data/int4_reference.safetensors: small AWQ and GPTQ matrices packed by the
reference implementations themselves, with the references' own dequantization, so the tests
check our unpacking (weights/int4_checkpoint.py) against them without the packages installed.

The references are never product dependencies. This script fetches their sources once (pip
download, no install: their CUDA extensions are not needed) and imports only their pure-torch
packing and dequantizing code:

- AutoAWQ 0.2.9: ``awq.modules.linear.gemm.WQLinear_GEMM.from_linear`` packs (the "gemm"
  version's interleaved nibble order), ``awq.utils.packing_utils.dequantize_gemm`` dequantizes;
  scales and zero points from ``AwqQuantizer.pseudo_quantize_tensor`` (its source, run as is).
- AutoGPTQ 0.7.1: ``auto_gptq.nn_modules.qlinear.qlinear_cuda.QuantLinear.pack`` packs (the
  historical format that stores each zero point minus one), its forward's torch path
  dequantizes (run on the identity); scales and zero points from its ``Quantizer``.
- GPTQModel 7.7.0's v1 -> v2 conversion (``convert_gptq_v1_to_v2_format_module``: every 32-bit
  zero word plus 0x11111111 at 4 bits) gives the ``gptq_v2`` variant.

Run: .venv/bin/python scripts/int4_reference_fixtures.py [--refs DIR]
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys
import tarfile
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace

import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "int4_reference.safetensors"
AWQ = "autoawq==0.2.9"
GPTQ = "auto-gptq==0.7.1"
ROWS, COLS = 32, 256  # out, in: small, yet four 64-input blocks and several 128-input groups
# name -> (method, group size, zero point / asymmetric, checkpoint format)
VARIANTS = {
    "awq_g128": ("awq", 128, True, "gemm"),
    "awq_g64": ("awq", 64, True, "gemm"),
    "awq_g32": ("awq", 32, True, "gemm"),
    "gptq_sym_g128": ("gptq", 128, False, "gptq"),
    "gptq_asym_g128": ("gptq", 128, True, "gptq"),
    "gptq_asym_g32": ("gptq", 32, True, "gptq"),
    "gptq_sym_channel": ("gptq", -1, False, "gptq"),
    "gptq_v2_asym_g64": ("gptq", 64, True, "gptq_v2"),
}


def fetch_sources(refs: Path) -> tuple[Path, Path]:
    """The AutoAWQ source tree and the AutoGPTQ wheel's files, downloaded once into ``refs``."""
    refs.mkdir(parents=True, exist_ok=True)
    awq_root, gptq_root = refs / "autoawq-0.2.9", refs / "auto_gptq-0.7.1"
    if not awq_root.is_dir() or not gptq_root.is_dir():
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(refs)]
        subprocess.run([*pip, "--no-binary", ":all:", AWQ], check=True)
        subprocess.run([*pip, "--only-binary", ":all:", GPTQ], check=True)
        with tarfile.open(next(refs.glob("autoawq-0.2.9.tar.gz"))) as tar:
            tar.extractall(refs)
        with zipfile.ZipFile(next(refs.glob("auto_gptq-0.7.1-*.whl"))) as wheel:
            wheel.extractall(gptq_root)
    return awq_root, gptq_root


def namespace(name: str, folder: Path) -> None:
    """A package whose submodules import from ``folder`` without running its __init__ (which
    pulls in the packages' model zoos and CUDA extensions)."""
    module = types.ModuleType(name)
    module.__path__ = [str(folder)]
    sys.modules[name] = module


def method_source(path: Path, cls: str, method: str):
    """A method of a class in a reference file, compiled from its own source text."""
    tree = ast.parse(path.read_text())
    node = next(
        f
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == cls
        for f in c.body
        if isinstance(f, ast.FunctionDef) and f.name == method
    )
    scope = {"torch": torch, "nn": torch.nn}
    exec(compile(ast.Module([node], []), str(path), "exec"), scope)  # noqa: S102
    return scope[method]


def awq_variant(awq_root: Path, weight: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    for name in ("awq", "awq.utils", "awq.modules", "awq.modules.linear"):
        namespace(name, awq_root / name.replace(".", "/"))
    gemm = importlib.import_module("awq.modules.linear.gemm")
    packing = importlib.import_module("awq.utils.packing_utils")
    pseudo_quantize = method_source(
        awq_root / "awq/quantize/quantizer.py", "AwqQuantizer", "pseudo_quantize_tensor"
    )
    quantizer = SimpleNamespace(w_bit=4, group_size=group, zero_point=True)
    # as AwqQuantizer._apply_quant: the layer's weight becomes its rounded self, the scales and
    # zero points go to from_linear transposed ([in / group, out])
    linear = torch.nn.Linear(COLS, ROWS, bias=False)
    linear.weight.data, scales, zeros = pseudo_quantize(quantizer, weight.clone())
    scales, zeros = scales.t().contiguous(), zeros.t().contiguous()
    packed = gemm.WQLinear_GEMM.from_linear(linear, 4, group, scales=scales, zeros=zeros)
    dequantized = packing.dequantize_gemm(
        packed.qweight, packed.qzeros, packed.scales, 4, group
    )  # [in, out] float16, as the reference computes it
    return {
        "qweight": packed.qweight,
        "qzeros": packed.qzeros,
        "scales": packed.scales,
        "dequantized": dequantized.t().contiguous(),
    }


def gptq_variant(
    gptq_root: Path, weight: torch.Tensor, group: int, asym: bool, v2: bool
) -> dict[str, torch.Tensor]:
    root = gptq_root / "auto_gptq"
    for name in ("auto_gptq", "auto_gptq.nn_modules", "auto_gptq.nn_modules.qlinear"):
        namespace(name, gptq_root / name.replace(".", "/"))
    namespace("auto_gptq.quantization", root / "quantization")
    qlinear = importlib.import_module("auto_gptq.nn_modules.qlinear.qlinear_cuda")
    quantizer_module = importlib.import_module("auto_gptq.quantization.quantizer")
    size = COLS if group == -1 else group
    weight = weight.half().float()  # a float16 model's weight, as GPTQ quantizes it
    scales, zeros = [], []
    for start in range(0, COLS, size):  # as GPTQ.fasterquant collects them, group by group
        quantizer = quantizer_module.Quantizer()
        quantizer.configure(4, perchannel=True, sym=not asym, mse=False)
        quantizer.find_params(weight[:, start : start + size], weight=True)
        scales.append(quantizer.scale)
        zeros.append(quantizer.zero)
    scales, zeros = torch.cat(scales, dim=1), torch.cat(zeros, dim=1)
    if not bool((zeros >= 1).all()):  # AutoGPTQ's packer cannot store a zero point of 0
        raise SystemExit("a zero point of 0: pick another seed")
    linear = torch.nn.Linear(COLS, ROWS, bias=False, dtype=torch.float16)  # a float16 model's
    linear.weight.data = weight.half()
    layer = qlinear.QuantLinear(4, group, COLS, ROWS, bias=False, weight_dtype=torch.float16)
    g_idx = torch.tensor([i // size for i in range(COLS)], dtype=torch.int32)
    layer.pack(linear, scales, zeros, g_idx)
    with torch.no_grad():  # the torch path of its forward (no CUDA extension): x = identity
        dequantized = layer(torch.eye(COLS, dtype=torch.float16))  # [in, out] float16
    qzeros = layer.qzeros
    if v2:  # GPTQModel's v1 -> v2 conversion at 4 bits, on 32-bit words
        qzeros = (qzeros.to(torch.int64) + 0x11111111).remainder(1 << 32)
        qzeros = torch.where(qzeros >= 1 << 31, qzeros - (1 << 32), qzeros).to(torch.int32)
    return {
        "qweight": layer.qweight,
        "qzeros": qzeros,
        "scales": layer.scales,
        "g_idx": layer.g_idx,
        "dequantized": dequantized.t().contiguous(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refs", type=Path, default=Path.home() / ".cache" / "minisgl-int4-refs")
    args = parser.parse_args()
    awq_root, gptq_root = fetch_sources(args.refs)
    from safetensors.torch import save_file

    tensors, described = {}, {}
    for index, (name, (method, group, asym, fmt)) in enumerate(VARIANTS.items()):
        gen = torch.Generator().manual_seed(index)
        weight = torch.randn(ROWS, COLS, generator=gen) * 0.05
        if method == "awq":
            parts = awq_variant(awq_root, weight, group)
            described[name] = {
                "quant_method": "awq",
                "bits": 4,
                "group_size": group,
                "zero_point": True,
                "version": fmt,
            }
        else:
            parts = gptq_variant(gptq_root, weight, group, asym, fmt == "gptq_v2")
            described[name] = {
                "quant_method": "gptq",
                "bits": 4,
                "group_size": group,
                "sym": not asym,
                "desc_act": False,
                "checkpoint_format": fmt,
            }
        for part, tensor in parts.items():
            tensors[f"{name}.{part}"] = tensor.contiguous()
    metadata = {
        "variants": json.dumps(described),
        "references": f"{AWQ}, {GPTQ}, gptqmodel==7.7.0 (v1 -> v2 zero words)",
        "shape": json.dumps([ROWS, COLS]),
    }
    save_file(tensors, OUT, metadata=metadata)
    print(f"{OUT}: {OUT.stat().st_size:,} bytes, {len(VARIANTS)} variants")


if __name__ == "__main__":
    main()
