"""The chat page (Gradio): ``build_ui`` lays it out, ``mount_ui`` serves it on a FastAPI app."""

from .mount import mount_ui
from .ui import build_ui

__all__ = ["build_ui", "mount_ui"]
