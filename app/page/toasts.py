"""The page's toasts. Gradio draws a toast's message as HTML, and messages quote what the user
gave (a chat's title, a file name): these show it as text. Handlers call them as ``toasts.warn``,
so that a test can listen to what the page says."""

from __future__ import annotations

import html

import gradio as gr


def warn(message: str) -> None:
    """A warning toast (``gr.Warning``): an action refused, and why."""
    gr.Warning(html.escape(message, quote=False))


def inform(message: str) -> None:
    """An information toast (``gr.Info``): news that refuses nothing."""
    gr.Info(html.escape(message, quote=False))
