"""A model folder with the first N layers of a converted GGUF model folder (config.json,
tokenizer, model.gguf): the same tensor types and shapes per layer in a fraction of the bytes, so
a GPU machine reached through a 64 MiB carry can serve a GGUF in one call.
    python scripts/gguf_shrink.py SRC_FOLDER DST_FOLDER [--layers 2]
"""

import argparse
import json
import re
import shutil
from pathlib import Path

import gguf


def shrink(src: Path, dst: Path, layers: int) -> None:
    reader = gguf.GGUFReader(str(src / "model.gguf"))
    arch = str(reader.fields["general.architecture"].contents())
    dst.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(dst / "model.gguf"), arch)
    for key in ("attention.head_count", "attention.head_count_kv"):
        writer.add_uint32(f"{arch}.{key}", int(reader.fields[f"{arch}.{key}"].contents()))
    writer.add_uint32(f"{arch}.block_count", layers)
    for tensor in reader.tensors:
        match = re.match(r"blk\.(\d+)\.", tensor.name)
        if match and int(match.group(1)) >= layers:
            continue
        writer.add_tensor(
            tensor.name,
            tensor.data,
            raw_shape=tensor.data.shape,
            raw_dtype=tensor.tensor_type,
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for name in src.iterdir():
        if name.name not in ("model.gguf", "config.json", ".complete") and name.is_file():
            shutil.copy(name, dst / name.name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    shrink(args.src, args.dst, args.layers)
