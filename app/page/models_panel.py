"""The models panel: the models a source offers, Switch (the current model serves until the new
one is checked), and Pull (download or convert a model) when this app runs its own engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import gradio as gr

from ..chat.reply_source import ModelEntry, ModelError
from ..chat.view import markdown_literal, model_choices
from ..model_pull import ModelPuller, PullError, PullProgress
from . import toasts
from .tabs import TabState
from .wiring import QUICK, Wiring

PULL_SHOW_S = 0.5  # a pull's progress line is shown at most this often


class ModelsPanel(TabState):
    """List, switch and pull models."""

    puller: (
        ModelPuller | None
    )  # pulls models onto this machine (None: a remote engine's models are the remote's)
    listed: dict[str, ModelEntry]  # the panel's last listing, by model name

    async def list_models(self, pick: str | None = None):
        """The panel's list: the models the source offers, the one serving marked (and picked,
        unless ``pick`` names another that is listed)."""
        entries = await self.source.list_models()
        self.listed = {e.name: e for e in entries}
        return gr.update(
            choices=model_choices(entries),
            value=pick if pick in self.listed else self.source.model_name,
        )

    async def pull_model(self, model: str):
        """Pull: a hub id downloaded, or a .gguf file converted, by a child process while the
        current model keeps serving; its progress shows until it ends, then the list has the new
        model picked. A pull already under way (from any tab) is followed instead."""
        try:
            progress = await self.puller.start(model)
        except PullError as exc:
            progress = self.puller.progress if self.puller.busy else None
            yield f"⚠️ {markdown_literal(exc)}", gr.skip(), self.cancel_offered()
            if progress is None:
                return
            await asyncio.sleep(PULL_SHOW_S)
        async for line in self.pull_lines(progress):
            yield line, gr.skip(), self.cancel_offered()
        yield progress.line(), await self.list_models(pick=progress.name), self.cancel_offered()

    async def pull_lines(self, progress: PullProgress):
        """``progress`` as the page shows it, at most every PULL_SHOW_S, until the pull ends."""
        while not progress.over:
            yield progress.line()
            await asyncio.sleep(PULL_SHOW_S)
            await self.puller.wait_change(PULL_SHOW_S)

    def cancel_offered(self):
        """Cancel pull is pressable only while a pull runs (it looked pressable with none)."""
        return gr.update(interactive=self.puller.busy)

    async def cancel_pull(self):
        if not await self.puller.cancel():
            return "No pull is under way.", self.cancel_offered()
        return self.puller.progress.line(), gr.update(
            interactive=False
        )  # the pull's own event says when it ended

    def pull_status(self):
        """The pull under way, for a panel just opened (a reloaded tab), and whether it can be cancelled."""
        return self.puller.progress.line() if self.puller.busy else gr.skip(), self.cancel_offered()

    async def switch_model(self, name: str | None, request: gr.Request):
        """Switch: the model is checked while the current one serves; then every reply in flight
        stops (marked as stopped by the switch), and the page says it is loading until it is
        ready. A model that cannot be served leaves the current one serving, with the reason. The
        panel's message is Markdown: names and reasons in it are shown as typed (markdown_literal)."""
        if not name:
            yield "Pick a model in the list first.", gr.skip(), gr.skip()
            return
        if name not in self.listed:  # picked from a listing this page object has not made
            await self.list_models()
        backend = self.listed[name].backend if name in self.listed else None
        # what the same backend serves now
        current = next(
            (e.name for e in self.listed.values() if e.serving and e.backend == backend),
            self.source.model_name,
        )
        shown, shown_current = markdown_literal(name), markdown_literal(current)
        if name == current:
            yield f"**{shown}** is the model serving now.", gr.skip(), gr.skip()
            return
        yield f"Checking **{shown}**… ({shown_current} keeps serving)", gr.skip(), gr.skip()
        try:
            await self.source.check_model(name)
        except ModelError as exc:
            toasts.warn(f"{name} cannot be served: {exc}")
            yield (
                f"⚠️ **{shown}** cannot be served: {markdown_literal(exc)}. {shown_current} keeps serving.",
                await self.list_models(),
                gr.skip(),
            )
            return
        self.replies.stop_every(f"switch to {name}", backend=backend)
        yield f"Loading **{shown}**… (the status line shows its progress)", gr.skip(), gr.skip()
        try:
            await self.source.switch_model(name)
        except ModelError as exc:
            toasts.warn(f"{name} could not be loaded.")
            message = f"⚠️ {markdown_literal(exc)}"
        else:
            message = f"Now serving **{shown}**."
        self.replies.notify()
        yield message, await self.list_models(), gr.update(visible=self.source.supports_thinking)

    def models_layout(self) -> SimpleNamespace:
        model_list = gr.Radio(
            choices=[], label="Pick one, then Switch", elem_id="model-list", interactive=True
        )
        with gr.Row():
            switch_btn = gr.Button(
                "Switch", elem_id="switch-model-btn", size="sm", variant="primary"
            )
            refresh_btn = gr.Button("Refresh", elem_id="refresh-models-btn", size="sm")
        model_message = gr.Markdown("", elem_id="model-message")
        pull = None
        if self.puller is not None:
            pull_box = gr.Textbox(
                label="Pull a model",
                placeholder="Qwen/Qwen3-0.6B or /path/to/model.gguf",
                elem_id="pull-input",
                info="A Hugging Face id (downloaded to its cache) or a .gguf file (converted once)",
            )
            with gr.Row():
                pull_btn = gr.Button("Pull", elem_id="pull-btn", size="sm")
                cancel_btn = gr.Button(
                    "Cancel pull", elem_id="cancel-pull-btn", size="sm", interactive=False
                )  # while a pull runs
            pull = SimpleNamespace(
                box=pull_box,
                pull_btn=pull_btn,
                cancel_btn=cancel_btn,
                message=gr.Markdown("", elem_id="pull-message"),
            )
        return SimpleNamespace(
            model_list=model_list,
            switch_btn=switch_btn,
            refresh_btn=refresh_btn,
            model_message=model_message,
            pull=pull,
        )

    def wire_models(self, w: Wiring) -> None:
        """The models panel's events: list, switch, and pull when this app can pull."""
        models, thinking = w.models, w.settings.thinking
        for trigger in (models.box.expand, models.refresh_btn.click):
            trigger(self.list_models, outputs=models.model_list, **QUICK)
        models.switch_btn.click(
            self.switch_model,
            inputs=models.model_list,
            outputs=[models.model_message, models.model_list, thinking],
            **QUICK,
        )
        if models.pull is not None:
            for trigger in (models.pull.pull_btn.click, models.pull.box.submit):
                trigger(
                    self.pull_model,
                    inputs=models.pull.box,
                    outputs=[models.pull.message, models.model_list, models.pull.cancel_btn],
                    **QUICK,
                )
            models.pull.cancel_btn.click(
                self.cancel_pull, outputs=[models.pull.message, models.pull.cancel_btn], **QUICK
            )
            models.box.expand(
                self.pull_status, outputs=[models.pull.message, models.pull.cancel_btn], **QUICK
            )
