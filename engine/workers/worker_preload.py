"""What the fork server imports once, before any worker exists (``launcher.worker_context``).

Workers are forked from the fork server, so each starts with torch, transformers' tokenizer
classes and the engine's code already imported. Each worker importing them on its own cost ~3 s
of CPU; on a 2-core laptop three at once made every start and every model switch seconds slower.
Imports only, and the process title: nothing here may touch CUDA or start a thread, because
every worker is a fork of this state. Importing this module anywhere else renames that process.
"""

import setproctitle

setproctitle.setproctitle(
    "minisgl-fork-server"
)  # in `ps`, beside the workers it forks (each renames itself)

import torch  # noqa: E402, F401
from transformers import AutoConfig, AutoTokenizer  # noqa: E402, F401 (transformers loads these lazily: here, once)

from .. import engine, tokenizer  # noqa: E402, F401
from . import detokenizer_worker, scheduler_worker, tokenizer_worker  # noqa: E402, F401
