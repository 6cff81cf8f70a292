"""The open database and its transactions, which each part of the store builds on.

Every write is one ``BEGIN IMMEDIATE`` transaction, so a crash never leaves half a turn and
concurrent writers (threads of the UI, a second app process) wait for each other instead of
failing. Every read is one transaction too, so its queries see one snapshot.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from .database import connect, private_file, private_journal, rollback
from .schema import SCHEMA_VERSION, migrate

_Store = TypeVar("_Store", bound="StoreBase")


class StoreBase:
    """One connection to the database file, migrated to this version's schema on opening. Safe
    to share between threads (they take turns on the connection); several processes may open
    one file."""

    def __init__(self, path: Path | None = None) -> None:
        """Open ``path`` (None: the app's own file in its data folder), creating it privately."""
        self.path = private_file(path)
        self._lock = threading.Lock()  # one connection, used by one thread at a time
        self._conn: sqlite3.Connection | None = connect(self.path)
        try:
            migrate(self._conn, self.path, SCHEMA_VERSION)
            private_journal(self.path)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the connection (WAL is checkpointed). Further calls raise."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self: _Store) -> _Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction. IMMEDIATE takes the write lock up front (waiting up to the busy
        timeout): a deferred one that reads first can fail at once when another writer commits."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                rollback(conn)
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: all its queries see the same snapshot."""
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"the conversation store {self.path} is closed")
        return self._conn
