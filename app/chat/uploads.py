"""The files the page takes in (Attach, Import chat): only those that Gradio's upload route stored
in this run, each deleted once read (its text is kept in the tab or the store).

Why the handlers check: an event's file is a ``FileData`` naming a server path, and the page is
mounted with ``gr.mount_gradio_app``, which leaves ``Blocks.has_launched`` False, so Gradio
(6.31) skips its own check that an event's file was uploaded (``processing_utils._check_allowed``
returns at once). A forged ``{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}``
sent to /gradio_api/queue/join is then *copied* by Gradio's preprocessing into its cache
(``save_file_to_cache``: ``GRADIO_TEMP_DIR/<hash>/passwd``) before the handler runs: the path the
handler gets lies inside the upload folder either way. So a path counts as uploaded only if
Gradio's upload route listed it (``Blocks.upload_file_set``, filled by ``/gradio_api/upload``), not
merely for where it lies. Anything else is refused with a message, deleted if Gradio copied it
into the folder, and nothing is read from it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import MutableSet
from pathlib import Path

from .store import IMPORT_LIMIT_BYTES

# The largest file the page accepts through Gradio's upload route (mount_gradio_app's
# max_file_size): an import is the largest file the page reads (Attach takes 1 MB).
UPLOAD_LIMIT_BYTES = IMPORT_LIMIT_BYTES

NOT_UPLOADED = (
    "it was not uploaded from this page (attach or import a file with the page's own button)"
)


class NotUploaded(ValueError):
    """A path the page's upload route did not store in this run."""


def upload_folder() -> Path:
    """Where Gradio stores uploads (utils.get_upload_folder): app/cli.py's private per-run folder."""
    return Path(
        os.environ.get("GRADIO_TEMP_DIR") or Path(tempfile.gettempdir()) / "gradio"
    ).resolve()


class Uploads:
    """The uploads of one page. ``stored``: the paths Gradio's upload route wrote (the Blocks'
    ``upload_file_set``, shared, so each upload shows at once); empty until the page is built,
    so nothing is accepted without it."""

    def __init__(self, folder: Path | None = None, stored: MutableSet[str] | None = None) -> None:
        self.folder = folder.resolve() if folder is not None else upload_folder()
        self.stored: MutableSet[str] = stored if stored is not None else set()

    def take(self, path: str) -> Path:
        """The uploaded file at ``path``; NotUploaded for any other path (it is deleted if it lies
        in the upload folder: a copy Gradio made of a forged path)."""
        real = Path(os.path.realpath(path))
        if self._inside(real) and any(os.path.realpath(p) == str(real) for p in self.stored):
            return real
        self.discard(path)
        raise NotUploaded(NOT_UPLOADED)

    def discard(self, path: str) -> None:
        """Delete the file at ``path`` (and its folder, once empty) if it lies in the upload folder;
        a path anywhere else is left alone."""
        real = Path(os.path.realpath(path))
        if not self._inside(real) or real == self.folder:
            return
        for p in [p for p in self.stored if os.path.realpath(p) == str(real)]:
            self.stored.discard(p)
        real.unlink(missing_ok=True)
        if real.parent != self.folder:
            try:
                real.parent.rmdir()  # Gradio's <hash>/ folder of this one file
            except OSError:
                pass  # not empty (another upload of the same bytes): kept

    def _inside(self, real: Path) -> bool:
        return real.is_relative_to(self.folder)
