"""What the schedulers' fork server imports once, before any scheduler exists
(``launcher.worker_context``).

Schedulers are forked from the fork server, so each starts with torch, transformers' config and
tokenizer classes and the engine's code already imported. Each importing them on its own cost
~3 s of CPU; on a 2-core laptop that made every start and every model switch seconds slower.
Imports only, and the process title: nothing here may touch CUDA or start a thread, because
every scheduler is a fork of this state. Importing this module anywhere else renames that
process. (The tokenizers and the detokenizer are spawned light, without any of this.)
"""

import setproctitle

setproctitle.setproctitle(
    "minisgl-fork-server"
)  # in `ps`, beside the workers it forks (each renames itself)

import torch  # noqa: E402, F401
from transformers import AutoConfig, AutoTokenizer  # noqa: E402, F401 (transformers loads these lazily: here, once)

from .. import engine  # noqa: E402, F401
from . import launcher, scheduler_worker  # noqa: E402, F401
