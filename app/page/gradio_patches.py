"""Where the page changes Gradio's own behaviour, each for a reason its docstring gives. Some
reach attributes that are not Gradio's public API: each checks that they are there and leaves
Gradio as it is otherwise (tests/unit/test_chat_logic.py fails when an upgrade renames them)."""

from __future__ import annotations

import gradio as gr

# Gradio's queue looks for new events every 1 ms while it has none: ~7% of a core for an idle
# app (measured with psutil, 2-core VM), CPU the engine then lacks. Every 20 ms costs a click at
# most 20 ms before its handler starts.
QUEUE_POLL_S = 0.02


def _slider_value_as_typed(self: gr.Slider, payload: float | None) -> float | None:
    return payload


def let_sliders_take_typed_values() -> None:
    """A slider's number box hands a typed value to the handler as typed. Gradio's own range
    check raises before any handler runs: a bare "Error" toast, a traceback in the log, and Send
    (whose inputs include the settings) failing. The chat's checks (``form_settings``) refuse it
    with a sentence instead and put the value in force back. Set on the class: a subclass makes
    Gradio write a .pyi stub beside this module, and Gradio re-creates a session's components,
    dropping an instance's own method. (The page's only sliders are temperature and top-p.)"""
    gr.Slider.preprocess = _slider_value_as_typed


def quiet_queue(demo: gr.Blocks) -> None:
    """Poll Gradio's event queue every QUEUE_POLL_S instead of every millisecond."""
    queue = getattr(demo, "_queue", None)
    if not hasattr(queue, "sleep_when_free") or not hasattr(
        queue, "progress_update_sleep_when_free"
    ):
        return  # a Gradio without them: the page works, its queue just polls as Gradio likes
    queue.sleep_when_free = QUEUE_POLL_S
    queue.progress_update_sleep_when_free = max(queue.progress_update_sleep_when_free, QUEUE_POLL_S)


def keep_session_queues(demo: gr.Blocks) -> None:
    """Keep a session's message queue when the browser closes one of its event streams. Gradio
    (6.31) drops it then, even while another stream of that session is open: that stream fails
    with a 404 inside its response (a Traceback in the log), and the page says Connection Lost
    and reloads itself (tests/browser/test_chat_page.py opens two streams to check it). The
    queues stay in Gradio's own bounded cache (its oldest sessions make room); a closed session's
    events are still ended by Gradio."""
    queue = getattr(demo, "_queue", None)
    queues = getattr(queue, "pending_messages_per_session", None)
    if not isinstance(queues, dict):
        return
    kept = type("KeptSessionQueues", (type(queues),), {"__delitem__": lambda self, session: None})
    replacement = kept.__new__(kept)
    replacement.__dict__.update(queues.__dict__)  # its bound (max_size)
    replacement.update(queues)
    queue.pending_messages_per_session = replacement


def check_uploads_as_launched(demo: gr.Blocks) -> None:
    """Gradio checks that an event's file lies in its upload folder only once it has launched
    the Blocks itself; mounted (gr.mount_gradio_app), it would read any path an event names and
    copy it into its cache before a handler runs (a forged "/dev/zero" hangs the server): the
    check is switched on (app/chat/uploads.py's is the second, stricter one)."""
    demo.has_launched = True
