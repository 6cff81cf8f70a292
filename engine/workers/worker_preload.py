"""What the schedulers' fork server imports once, before any scheduler exists
(``launcher.worker_context``).

Schedulers are forked from the fork server, so each starts with torch and the engine's code
already imported. Each importing them on its own cost seconds of CPU; on a 2-core laptop that
made every start and every model switch slower. transformers is not imported: the scheduler
reads config.json without it (``hf_config``) and imports it only where a model needs it (a
config that leaves numbers to a class default, a grammar's tokenizer for xgrammar).
Imports only, and the process title: nothing here may touch CUDA or start a thread, because
every scheduler is a fork of this state. That includes OpenMP's thread team: a torch operation
run here (a check at import) would start it, and a forked scheduler's first parallel operation
then waits forever (seen on a 16-core GPU machine: the first weight copy hung). So torch runs on
one thread while the engine is imported, and nothing at import may compute anyway
(test_public_surface checks it). Importing this module anywhere else renames that
process. (The tokenizers and the detokenizer are spawned light, without any of this.)
"""

import setproctitle

setproctitle.setproctitle(
    "minisgl-fork-server"
)  # in `ps`, beside the workers it forks (each renames itself)

import torch  # noqa: E402

_threads = torch.get_num_threads()
torch.set_num_threads(1)  # an operation run by an import stays on this thread: no team to inherit

from .. import engine  # noqa: E402, F401
from . import launcher, scheduler_worker  # noqa: E402, F401

torch.set_num_threads(_threads)  # what each forked scheduler starts with (it sets its own on CPU)
