"""Settings read from the environment: the ``MINISGL_*`` switches of the GPU fast path, kept for
measuring one choice against another (docs/benchmarks.md). A module of its own so that the
kernel modules, which the others import, can read them without importing back up."""

from __future__ import annotations

import os


def env_choice(name: str, choices: tuple[str, ...]) -> str:
    """The environment variable ``name``, one of ``choices`` (unset or empty: the first); any
    other value is an error naming the choices, not a silent fallback."""
    value = os.environ.get(name, "").strip().lower() or choices[0]
    if value not in choices:
        raise ValueError(f"{name}={value!r}: use one of {', '.join(choices)}")
    return value


def env_ints(name: str, fields: tuple[str, ...], default: tuple[int, ...]) -> tuple[int, ...]:
    """The environment variable ``name`` as comma-separated positive integers, one per field of
    ``fields`` (unset or empty: ``default``); anything else is an error naming the fields."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    parts = [p.strip() for p in value.split(",")]
    if len(parts) != len(fields) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"{name}={value!r}: use {len(fields)} positive integers, {','.join(fields)}"
        )
    return tuple(int(p) for p in parts)
