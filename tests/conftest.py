"""Shared fixtures: tiny random models of every architecture, saved once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# Some test modules import helpers from a test module of another layer (test_model_parity's
# reference checks, test_browser's reply readers): every layer's folder is importable, whichever
# subset of the suite runs.
for layer in ("unit", "server", "browser", "gpu", "soak"):
    sys.path.append(str(Path(__file__).parent / layer))

from tiny_models import make_tiny_model  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (CUDA)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """``tiny_model(arch)`` -> (folder, transformers model) for a random float32 checkpoint."""
    made: dict[str, tuple[Path, object]] = {}

    def get(arch: str):
        if arch not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            made[arch] = (folder, make_tiny_model(arch, folder))
        return made[arch]

    return get


def pytest_addoption(parser):
    # Here rather than in tests/soak/conftest.py so that the option is known however pytest is
    # started (a conftest below the root one is not an "initial" conftest for `pytest tests/x.py`).
    parser.addoption(
        "--soak-scale",
        choices=("short", "full"),
        default="short",
        help="size of the soak suite under tests/soak: short (CI, default) or full",
    )


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory):
    """One `minisgl-chat serve` of the demo model (two tokenizer workers, 64 running requests, a
    small prefill budget: server_utils.MAX_PREFILL_TOKENS), shared by every test file that needs
    real text from a real server, the soak suite's included: a start costs ~20 s on CI.

    Its weights are widened to float32 (``--quantization none``) and its KV cache is float32
    (``--kv-dtype float32``): these tests compare replies and log-probabilities across batch
    compositions (under load, with cached prefixes, echo against generation), which the float32
    path reproduces to ~1e-6. A float16 cache (the CPU's default) rounds a K or V value that
    float32 noise moves across a rounding step one way in one batch and the other way in another
    (a seeded choice of n=3 drew other tokens than the same request alone). The packed path
    rounds activations to bf16 before each product, so a path that sums in another order moves a
    log-probability by up to a few hundredths and flips greedy choices at near-ties;
    tests/unit/test_quantized.py checks that path against this one, and every other server test
    runs it (the default)."""
    from server_utils import MAX_KV_TOKENS, MAX_PREFILL_TOKENS, ServerProcess

    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    srv = ServerProcess(
        "--num-tokenizer",
        "2",
        "--quantization",
        "none",
        "--kv-dtype",
        "float32",
        "--max-kv-tokens",
        str(MAX_KV_TOKENS),
        "--max-prefill-tokens",
        str(MAX_PREFILL_TOKENS),
        "--max-running-requests",
        "64",
        log_path=tmp_path_factory.mktemp("demo-server") / "serve.log",
    )
    yield srv
    srv.stop()


class ChatApp:
    """A running `minisgl-chat chat` of the demo model on its own data folder (``data_dir``);
    ``restart`` stops it and starts another on the same folder and port. Anything else is the
    running ServerProcess's (url, metrics, workers, ...)."""

    def __init__(self, data_dir: Path, logs: Path) -> None:
        self.data_dir, self.logs, self.starts = data_dir, logs, 0
        self.files_seen: list[Path] = []  # the app's private files folders seen in download URLs
        self.srv = self._start(None)

    def _start(self, port: int | None):
        from server_utils import ServerProcess

        self.starts += 1
        return ServerProcess(
            "--no-browser",
            "--max-kv-tokens",
            "16384",
            command="chat",
            log_path=self.logs / f"app-{self.starts}.log",
            env={"MINISGL_DATA_DIR": str(self.data_dir)},
            port=port,
        )

    def __getattr__(self, name: str):
        return getattr(self.srv, name)

    def restart(self) -> None:
        self.srv.stop()
        self.start_again()

    def start_again(self) -> None:
        """After a stop: another app on the same folder and port."""
        self.srv = self._start(self.srv.port)

    def stop(self) -> None:
        self.srv.stop()


@pytest.fixture(scope="session")
def chat_app(tmp_path_factory):
    """One chat app (ChatApp) on a fresh data folder, shared by test_browser, test_chat_features,
    test_chat_page and test_web_security (a start costs ~20 s on CI). Each of the app's files
    folders that the tests saw must be gone once it stops."""
    from minisgl_engine.weights.demo import demo_model_dir
    from minisgl_engine.weights.gguf_convert import is_complete

    if not is_complete(demo_model_dir()):
        pytest.skip("demo model not pulled: run `minisgl-chat pull`")
    app = ChatApp(tmp_path_factory.mktemp("chat-app-data"), tmp_path_factory.mktemp("chat-app"))
    yield app
    app.stop()
    assert not [str(f) for f in app.files_seen if f.exists()], (
        "the app left its files folder behind"
    )


@pytest.fixture(scope="session")
def tiny_qwen3_server(tiny_model, tmp_path_factory):
    """The tiny random Qwen3 served on one rank and one replica, with the demo model's tokenizer:
    the reference that test_tensor_parallel's --tp 2 and test_data_parallel's --dp 2 servers
    must match token for token."""
    from server_utils import ServerProcess

    from minisgl_engine.weights.demo import demo_model_dir

    srv = ServerProcess(
        "--model",
        str(tiny_model("qwen3")[0]),
        "--tokenizer",
        str(demo_model_dir()),
        log_path=tmp_path_factory.mktemp("tiny-qwen3-server") / "serve.log",
    )
    yield srv
    srv.stop()
