"""Unit tests: no server process, no browser; the layer `make test-fast` runs in about a minute (marker `unit`, added to every test in this folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

FOLDER = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if FOLDER in item.path.parents:
            item.add_marker(pytest.mark.unit)
