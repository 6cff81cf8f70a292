"""What every bench shares: the device's name and each JSON line's first fields, random prompts,
timing our engine and transformers (on the same weights), and the machine's load around a run."""

from __future__ import annotations

import contextlib
import platform
import random
import subprocess
import sys
import time

import torch

from ..config import EngineConfig
from ..errors import UserError
from ..sampling_params import SamplingParams

WARMUP_LEN = 20  # prompt + output tokens of the untimed first run
TORCH_DEFAULT_THREADS = torch.get_num_threads()  # before any engine picks its own count


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({TORCH_DEFAULT_THREADS} threads)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({TORCH_DEFAULT_THREADS} threads)"


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def row_header(bench: str, config: EngineConfig, engine) -> dict:
    """The fields every JSON line starts with: which bench, where, which model."""
    return {
        "bench": bench,
        "device": device_name(engine.device),
        "model": config.config if config.dummy_weights and config.config else str(engine.model_dir),
        "dtype": str(engine.dtype).removeprefix("torch."),
        "kv_dtype": str(engine.kv_dtype).removeprefix("torch."),
        "quantization": engine.quantization,
        "weight_gib": round(engine.weight_bytes / 2**30, 3),  # as held on the device
        "tp": config.tp,
        "dp": config.dp,
    }


def random_prompts(batch_size: int, input_len: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(10, min(vocab, 10000)) for _ in range(input_len)] for _ in range(batch_size)
    ]


def time_engine(llm, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    """(seconds for the whole batch, seconds to the first token of every request)."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    sync_device(llm.engine.device)
    start = time.perf_counter()
    first = None
    for _index, _token, _finish in llm.stream(prompts, params):
        if first is None:
            first = time.perf_counter()
    sync_device(llm.engine.device)
    end = time.perf_counter()
    return end - start, (first or end) - start


def hf_model_for(llm, seed: int):
    """transformers' model with exactly our engine's weights."""
    from transformers import AutoModelForCausalLM

    if llm.engine.model_dir is not None and not llm.config.dummy_weights:
        from ..weights.gguf_tensors import GGUF_WEIGHTS

        gguf = (
            {"gguf_file": GGUF_WEIGHTS} if (llm.engine.model_dir / GGUF_WEIGHTS).is_file() else {}
        )
        hf = AutoModelForCausalLM.from_pretrained(
            llm.engine.model_dir, dtype=llm.engine.dtype, **gguf
        )
    else:  # random weights: let transformers draw them, then copy them into our model
        torch.manual_seed(seed)
        from ..hf_config import load_hf_config

        hf_config = load_hf_config(llm.config, llm.engine.model_dir)
        hf = AutoModelForCausalLM.from_config(hf_config, dtype=llm.engine.dtype)
        llm.engine.model.load_weights(hf.state_dict().items())
    return hf.to(llm.engine.device).eval()


@torch.inference_mode()
def time_hf(hf, prompts: list[list[int]], output_len: int, device: torch.device) -> float:
    input_ids = torch.tensor(prompts, device=device)
    kwargs = dict(
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=output_len,
        min_new_tokens=output_len,
        pad_token_id=0,
    )
    sync_device(device)
    start = time.perf_counter()
    out = hf.generate(input_ids, **kwargs)
    sync_device(device)
    assert out.shape[1] == input_ids.shape[1] + output_len
    return time.perf_counter() - start


@contextlib.contextmanager
def busy_cores(count: int):
    """``count`` other processes, each keeping one core busy, for as long as the block runs: the
    machine a chat app meets beside a browser or a build (``bench decode --busy-cores N``)."""
    if count < 0:
        raise UserError(f"--busy-cores must be >= 0, got {count}")
    # in sessions of their own, as another program's processes are (the engine does not count
    # its own process group as others)
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def threads_of_transformers(llm):
    """transformers runs with torch's own thread count (every core), as its users run it; the
    engine's CPU path then picks its own count again."""
    threads = llm.engine.cpu_threads
    if threads is None:
        yield
        return
    torch.set_num_threads(TORCH_DEFAULT_THREADS)
    try:
        yield
    finally:
        threads.forget_applied()
