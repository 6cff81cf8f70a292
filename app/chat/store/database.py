"""The database file: where it lives, its permissions, and a connection to it.

The file is ``platformdirs.user_data_dir("minisgl-chat")/chats.sqlite3`` (the folder can be
overridden with ``MINISGL_DATA_DIR``). It holds the user's chats, so it is private to the user:
the file 0600, the folder 0700, set before SQLite first writes to them.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import platformdirs

APP_NAME = "minisgl-chat"
DATA_DIR_ENV = "MINISGL_DATA_DIR"
DB_NAME = "chats.sqlite3"
BUSY_TIMEOUT_S = 30.0


def data_dir() -> Path:
    """The app's data folder: ``$MINISGL_DATA_DIR`` or the platform's user data dir."""
    return Path(os.environ.get(DATA_DIR_ENV) or platformdirs.user_data_dir(APP_NAME))


def default_path() -> Path:
    return data_dir() / DB_NAME


def private_file(path: Path | None) -> Path:
    """The database file to open (None: the app's own), created 0600 in a private folder. The
    app's own folder is tightened to 0700 if it is looser; a folder the caller named is created
    private but otherwise left as it is (it may be shared on purpose)."""
    if path is None:
        folder = data_dir()
        _private_folder(folder, tighten=True)
        path = folder / DB_NAME
    else:
        path = Path(path)
        _private_folder(path.parent, tighten=False)
    _create_private_file(path)
    return path


def connect(path: Path) -> sqlite3.Connection:
    """A connection with rows by column name, foreign keys on, and writers that wait for each
    other up to BUSY_TIMEOUT_S. ``isolation_level=None``: no implicit transactions; the store
    opens each one explicitly."""
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


def private_journal(path: Path) -> None:
    """Make the WAL's two files 0600. SQLite creates them with the database file's mode; this
    makes sure of it, as they hold the same chats."""
    for suffix in ("-wal", "-shm"):
        try:
            os.chmod(f"{path}{suffix}", 0o600)
        except FileNotFoundError:
            pass


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # some errors (disk full, I/O) have rolled back already
        conn.execute("ROLLBACK")


def _private_folder(folder: Path, tighten: bool) -> None:
    """Create ``folder`` as 0700; with ``tighten``, also take group/other access off an existing one."""
    existed = folder.is_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if tighten or not existed:
        os.chmod(folder, 0o700)  # mkdir's mode is filtered by the umask; this is exact


def _create_private_file(path: Path) -> None:
    """Create the database file as 0600 before SQLite opens it (SQLite would use 0644 & ~umask)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)  # an existing file with a looser mode, too
