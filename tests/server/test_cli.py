"""The real ``minisgl-chat`` console script, run as a user would: a problem the user can fix is
one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fork import ForkedCLI

TIMEOUT = 300


def cli() -> list[str]:
    """The installed console script next to this interpreter, else the module."""
    script = Path(sys.executable).with_name("minisgl-chat")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "minisgl_app.cli"]


FORKED: list[ForkedCLI] = []  # the module's forking process (forked_cli)


@pytest.fixture(scope="module", autouse=True)
def forked_cli(tmp_path_factory):
    """Most runs are forked from one process that imported the CLI once (cli_fork.py)."""
    runner = ForkedCLI.start(tmp_path_factory.mktemp("cli-runs"))
    FORKED[:] = [runner]
    yield runner
    FORKED.clear()
    runner.close()


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``minisgl-chat ARGS`` in a process of its own (forked: see cli_fork.py)."""
    return FORKED[0].run(*args, cwd=cwd, timeout=TIMEOUT)


def run_fresh_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``minisgl-chat ARGS`` as a fresh process, imports and all (what it prints while loading
    counts too)."""
    return subprocess.run([*cli(), *args], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit code 2, and stderr is exactly one line naming the problem."""
    err = proc.stderr
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("minisgl-chat"), line
    assert "error" in line
    for needle in needles:
        assert needle.lower() in line.lower(), (needle, line)
    return line


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random Llama saved as a real checkpoint (no tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    folder = tmp_path_factory.mktemp("cli-tiny")
    cfg = LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=1,
        bos_token_id=0,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(folder)
    return folder


# ---- bad input: one line, exit 2 -------------------------------------------------------------


def test_missing_model_path(tmp_path) -> None:
    missing = tmp_path / "nonexistent" / "path"
    proc = run_fresh_cli("generate", "--model", str(missing), "hi")
    assert_one_line_error(proc, str(missing))
    proc = run_cli("generate", "--model", "/nonexistent/path", "hi")
    assert_one_line_error(proc, "/nonexistent/path")


def test_unsupported_architecture(tmp_path) -> None:
    folder = tmp_path / "starcoder"
    folder.mkdir()
    # a small but valid GPTBigCode config: transformers knows it, we do not
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt_bigcode",
                "architectures": ["GPTBigCodeForCausalLM"],
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
            }
        )
    )
    line = assert_one_line_error(run_cli("generate", "--model", str(folder), "hi"), "gpt_bigcode")
    assert "llama" in line  # and it says what is supported


def test_unknown_model_type(tmp_path) -> None:
    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "frobnicator", "vocab_size": 320})
    )
    assert_one_line_error(run_cli("generate", "--model", str(folder), "hi"), "frobnicator")


def test_unsupported_architecture_with_odd_config_is_still_one_line(tmp_path) -> None:
    folder = tmp_path / "starcoder-odd"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt_bigcode",
                "n_embd": 64,
                "n_layer": 2,
                "n_head": 4,
                "vocab_size": 320,
            }
        )
    )
    assert_one_line_error(run_cli("generate", "--model", str(folder), "hi"), "gpt_bigcode")


@pytest.mark.parametrize("keep", [0, 5000, -1000], ids=["empty", "header-only", "tail-cut"])
def test_corrupt_weights(tiny_dir, tmp_path, keep) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    shutil.copy(tiny_dir / "config.json", folder / "config.json")
    data = (tiny_dir / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:keep])
    assert_one_line_error(
        run_cli("generate", "--model", str(folder), "--device", "cpu", "hi"), "model.safetensors"
    )


def test_bad_dtype(tiny_dir) -> None:
    assert_one_line_error(
        run_cli("generate", "--model", str(tiny_dir), "--dtype", "nope", "hi"), "nope"
    )


@pytest.mark.parametrize(
    ("port", "needle"), [("70000", "between 0 and 65535"), ("-1", "between 0 and 65535")]
)
def test_a_port_out_of_range_is_a_one_line_error(port, needle) -> None:
    assert_one_line_error(run_fresh_cli("serve", "--port", port), needle)


def test_an_unknown_host_is_a_one_line_error_naming_the_flag() -> None:
    line = assert_one_line_error(
        run_cli("serve", "--host", "no-such-host.invalid", "--api-key", "k", "--port", "0"),
        "--host",
    )
    assert "another server" not in line  # not the busy-port hint


@pytest.mark.parametrize(
    ("err", "needle"),
    [
        (errno.EADDRINUSE, "another server"),
        (errno.EACCES, "1024"),
        (errno.EADDRNOTAVAIL, "--host 127.0.0.1"),
    ],
)
def test_each_bind_error_says_which_flag_to_change(err, needle) -> None:
    from minisgl_engine.api.server import bind_error_hint

    hint = bind_error_hint("192.0.2.1", 80, OSError(err, os.strerror(err)))
    assert needle in hint and "192.0.2.1:80" in hint


@pytest.mark.parametrize("command", ["serve", "chat"])
def test_served_model_names_are_repeatable_or_comma_separated_in_order_once_each(command) -> None:
    from minisgl_app.cli import build_parser, server_config_from_args

    def names(*flags: str) -> tuple[str, ...]:
        return server_config_from_args(
            build_parser().parse_args([command, *flags])
        ).served_model_names

    assert names() == ()
    assert names("--served-model-name", "my-assistant") == ("my-assistant",)
    assert names(
        "--served-model-name", "a", "b,c", "--port", "0", "--served-model-name", "a, d"
    ) == ("a", "b", "c", "d")


def test_dummy_weights_without_config() -> None:
    assert_one_line_error(
        run_cli("bench", "decode", "--dummy-weights", "--device", "cpu"), "--config"
    )


def test_dummy_weights_with_unknown_config() -> None:
    line = assert_one_line_error(
        run_cli("bench", "decode", "--dummy-weights", "--config", "nope", "--device", "cpu"), "nope"
    )
    assert "qwen3-0.6b" in line  # lists what exists


def test_generate_without_a_tokenizer(tiny_dir) -> None:
    assert_one_line_error(
        run_cli("generate", "--model", str(tiny_dir), "--device", "cpu", "hi"), "tokenizer"
    )


# ---- the demo model ------------------------------------------------------------------------


@pytest.fixture
def demo_dir() -> Path:
    from minisgl_engine.weights import demo
    from minisgl_engine.weights.gguf_convert import is_complete

    folder = demo.demo_model_dir()
    if not is_complete(folder):
        pytest.skip(f"demo model not pulled into {folder} (run `minisgl-chat pull`)")
    return folder


@pytest.mark.slow
def test_generate_answers_the_capital_of_france(demo_dir) -> None:
    proc = run_fresh_cli(
        "generate", "What is the capital of France?", "--max-tokens", "32", "--device", "cpu"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Paris" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_generate_with_a_prompt_longer_than_the_context(demo_dir) -> None:
    proc = run_cli("generate", "hello " * 9000, "--max-tokens", "4", "--device", "cpu")
    line = assert_one_line_error(proc, "context", "8192")
    assert proc.stdout.strip() == ""
    assert len(line) < 300


# ---- bench ---------------------------------------------------------------------------------

BENCH_KEYS = {
    "bench",
    "device",
    "model",
    "dtype",
    "kv_dtype",
    "quantization",
    "weight_gib",
    "tp",
    "dp",
    "cache",
    "page_size",
    "batch_size",
    "input_len",
    "output_len",
    "engine_tok_s",
    "hf_tok_s",
    "hf_settings",
    "ttft_ms",
    "busy_cores",
    "engine_threads",
}


def check_bench_json(
    proc: subprocess.CompletedProcess, tiny_dir: Path, input_len: int, output_len: int
) -> None:
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(row) == BENCH_KEYS
    assert row["bench"] == "decode"
    assert (row["batch_size"], row["input_len"], row["output_len"]) == (1, input_len, output_len)
    assert row["model"] == str(tiny_dir)
    assert (row["dtype"], row["kv_dtype"], row["tp"], row["cache"], row["page_size"]) == (
        "float32",
        "float16",
        1,
        "radix",
        1,
    )
    assert isinstance(row["device"], str) and row["device"]
    for key in ("engine_tok_s", "hf_tok_s", "ttft_ms"):  # measured: positive, whatever their values
        assert isinstance(row[key], (int, float)) and row[key] > 0, key
    assert isinstance(row["hf_settings"], str) and "transformers" in row["hf_settings"]


def test_bench_decode_compare_hf_prints_a_json_line(tiny_dir) -> None:
    proc = run_cli(
        "bench",
        "decode",
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--compare-hf",
        "--output-len",
        "4",
        "--input-len",
        "16",
    )
    check_bench_json(proc, tiny_dir, 16, 4)


def test_bench_decode_short_lengths(tiny_dir) -> None:
    proc = run_cli(
        "bench",
        "decode",
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--compare-hf",
        "--output-len",
        "4",
        "--input-len",
        "8",
    )
    check_bench_json(proc, tiny_dir, 8, 4)


def test_bench_decode_busy_cores_runs_beside_spinning_processes_and_stops_them(tiny_dir) -> None:
    import psutil

    before = {p.pid for p in psutil.process_iter()}
    proc = run_cli(
        "bench",
        "decode",
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--busy-cores",
        "1",
        "--output-len",
        "4",
        "--input-len",
        "8",
    )
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["busy_cores"] == 1 and row["engine_threads"] >= 1
    spinners = [
        p
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.pid not in before and "while True: pass" in " ".join(p.info["cmdline"] or [])
    ]
    assert spinners == [], "the spinning processes outlived the bench"


def test_bench_decode_negative_busy_cores_is_a_one_line_error(tiny_dir) -> None:
    assert_one_line_error(
        run_cli(
            "bench", "decode", "--model", str(tiny_dir), "--device", "cpu", "--busy-cores", "-1"
        ),
        "--busy-cores",
    )


MULTITURN_KEYS = {
    "bench",
    "device",
    "model",
    "dtype",
    "kv_dtype",
    "quantization",
    "weight_gib",
    "tp",
    "dp",
    "cache",
    "page_size",
    "conversations",
    "turns",
    "system_len",
    "user_len",
    "reply_len",
    "ttft_ms_per_turn",
    "last_turn_ttft_ms",
    "regenerate_ttft_ms",
    "prefix_cache_hit_tokens",
    "replies_identical",
}


def test_bench_multiturn_runs_radix_and_naive_side_by_side(tiny_dir) -> None:
    proc = run_cli(
        "bench",
        "multiturn",
        "--model",
        str(tiny_dir),
        "--device",
        "cpu",
        "--conversations",
        "3",
        "--turns",
        "3",
        "--system-len",
        "24",
        "--user-len",
        "4",
        "--reply-len",
        "5",
        "--page-size",
        "4",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    assert "radix TTFT ms" in proc.stdout and "identical under both caches: yes" in proc.stdout
    radix, naive = (json.loads(line) for line in lines[-2:])
    for row, cache in ((radix, "radix"), (naive, "naive")):
        assert set(row) == MULTITURN_KEYS
        assert (
            row["bench"],
            row["cache"],
            row["conversations"],
            row["turns"],
            row["page_size"],
        ) == ("multiturn", cache, 3, 3, 4)
        assert (
            len(row["ttft_ms_per_turn"]) == 3
            and row["last_turn_ttft_ms"] == row["ttft_ms_per_turn"][-1]
        )
        assert row["replies_identical"] is True
    # turn 1 finds the system prompt (24 tokens); turns 2 and 3 the previous turn, page-aligned;
    # the regenerate its whole 46-token prompt but the last token, page-aligned: 44
    assert radix["prefix_cache_hit_tokens"] == 3 * (24 + 32 + 40 + 44)
    assert "regenerate last reply" in proc.stdout
    assert naive["prefix_cache_hit_tokens"] == 0


def test_flashinfer_attention_on_cpu_is_a_clear_error(tiny_dir) -> None:
    line = assert_one_line_error(
        run_cli(
            "generate", "--model", str(tiny_dir), "--device", "cpu", "--attn", "flashinfer", "hi"
        ),
        "--attn flashinfer",
    )
    assert "--attn torch" in line  # says what to do


def test_negative_cuda_graph_batch_size(tiny_dir) -> None:
    assert_one_line_error(
        run_cli(
            "generate",
            "--model",
            str(tiny_dir),
            "--device",
            "cpu",
            "--cuda-graph-max-bs",
            "-1",
            "hi",
        ),
        "--cuda-graph-max-bs",
    )


def test_negative_page_size(tiny_dir) -> None:
    line = assert_one_line_error(
        run_cli("generate", "--model", str(tiny_dir), "--device", "cpu", "--page-size", "-1", "hi"),
        "--page-size",
    )
    assert "0: by device" in line  # says which values it takes


def test_bench_page_without_a_browser_says_what_to_install(tmp_path) -> None:
    assert_one_line_error(
        run_cli("bench", "page", "--chromium", str(tmp_path / "no-chromium")),
        "apt-get install chromium",
    )


def test_generate_with_dummy_weights_and_no_seed(tmp_path) -> None:
    """`generate --dummy-weights` (random weights, a real config's shapes) runs without --seed:
    the sampling seed is not the dummy weights' seed."""
    from transformers import AutoTokenizer, LlamaConfig

    from minisgl_engine.weights.demo import demo_model_dir

    demo = demo_model_dir()
    if not (demo / "tokenizer.json").exists():
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    folder = tmp_path / "shapes"
    LlamaConfig(
        vocab_size=AutoTokenizer.from_pretrained(demo).vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    ).save_pretrained(folder)
    proc = run_cli(
        "generate",
        "--model",
        str(folder),
        "--tokenizer",
        str(demo),
        "--dummy-weights",
        "--device",
        "cpu",
        "--max-tokens",
        "4",
        "hi",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
