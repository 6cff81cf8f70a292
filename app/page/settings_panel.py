"""The settings form: each box saved to the chat shown when committed (a box left or Enter, a
slider let go), checked first (a refused value is said in a toast and the box shows the value in
force again); and where the chat's replies come from, when the app has several backends."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import gradio as gr

from ..chat.settings_form import (
    REFILLED_WHEN_EMPTY,
    RESET_FIELDS,
    SETTING_FIELDS,
    SettingsForm,
    form_settings,
    max_tokens_problem,
    with_backend_of,
)
from ..chat.store import (
    DROP_OLDEST,
    REPETITION_PENALTY_MAX,
    STOP_AT_CONTEXT,
    ChatSettings,
    NotFoundError,
)
from . import toasts
from .scripts import STAMP_JS
from .tabs import Tab, TabState
from .wiring import QUICK, Wiring


class SettingsPanel(TabState):
    """The settings of the chat a tab shows, or of its new chat."""

    async def settings_changed(
        self, form: SettingsForm, clicked_at: float | None, request: gr.Request
    ) -> tuple:
        """Save the fields when one is committed (a box left or Enter, a slider let go:
        ``wire_settings``), not on every key: a value typed digit by digit is never saved by its
        prefixes. A refused
        value is not saved; one toast says why and the box shows the value in force again, as an
        emptied box does (it saves nothing). A box left by a click on another chat
        (``clicked_at``, browser ms, no later than that click's) holds the settings of the chat
        shown before: they go there, whichever event the server takes first."""
        keep = (gr.skip(),) * len(SETTING_FIELDS)
        tab = self.tab(request)
        if (
            clicked_at is not None and clicked_at <= tab.events.shown_since
        ):  # the boxes show another chat now
            try:
                before = (
                    self.store.get(tab.events.shown_before).settings
                    if tab.events.shown_before is not None
                    else None
                )
            except NotFoundError:
                before = None
            if before is None:  # a new chat left unsent (or a chat deleted): nothing to keep
                return keep
            settings, problems = self.checked_form(form, before)
            if not self.settings_refused(problems):
                self.store_settings(tab, tab.events.shown_before, settings)
            return keep
        if clicked_at is not None and clicked_at < tab.events.settings_stamp:
            return (
                keep  # a newer save (of another box) carried this box's value too, and is applied
            )
        settings, problems = self.checked_form(form, self.settings_in_force(tab))
        if self.save_settings(tab, settings, problems) and clicked_at is not None:
            tab.events.settings_stamp = clicked_at
        tab.events.refused_form = form if problems else None
        in_force = self.settings_in_force(tab)
        # only boxes that must change are sent: another box may be being typed into meanwhile
        back = set(problems) | {
            name for name in REFILLED_WHEN_EMPTY if getattr(form, name) in (None, "")
        }
        return tuple(
            getattr(in_force, name) if name in back and name in RESET_FIELDS else gr.skip()
            for name in SETTING_FIELDS
        )

    async def backend_changed(self, backend: str | None, request: gr.Request) -> None:
        """Replies from: this chat's next replies come from ``backend`` (a reply streaming now
        goes on where it started)."""
        tab = self.tab(request)
        if backend not in self.source.backends:
            return
        self.save_settings(tab, replace(self.settings_in_force(tab), backend=backend), {})
        self.replies.notify()

    def checked_form(
        self, form: SettingsForm, in_force: ChatSettings
    ) -> tuple[ChatSettings, dict[str, str]]:
        """``form_settings`` of ``form``, and one check it cannot make alone: max
        tokens no larger than the context of the model serving the chat (the store's limit,
        32,768, lets 32,768 through for a model of 8,192). A bad max tokens, too small, too large
        or not whole, is said in one message naming one range (max_tokens_problem), whichever
        check refused it."""
        settings, problems = form_settings(form, in_force=in_force)
        source = self.backend_of(with_backend_of(settings, in_force))[1]
        context = getattr(source, "context_len", None)  # None: a source that does not know it
        n = settings.max_tokens
        if "max_tokens" in problems or (context and isinstance(n, int) and n > context):
            problems["max_tokens"] = max_tokens_problem(n, context, source.model_name)
        return settings, problems

    def save_settings(self, tab: Tab, settings: ChatSettings, problems: dict[str, str]) -> bool:
        """Apply the fields (as ``form_settings`` read them) to the tab's chat. Invalid values are
        refused with a toast naming them and are not used; returns whether the settings are in force."""
        if self.settings_refused(problems):
            return False
        if tab.conv_id is None:
            tab.new_chat_settings = with_backend_of(settings, self.settings_of(tab, None))
            self.note_fields(tab, None, settings=tab.new_chat_settings)
        else:
            self.store_settings(tab, tab.conv_id, settings)
        return True

    @staticmethod
    def settings_refused(problems: dict[str, str]) -> bool:
        """Whether the form has invalid values; a toast names them."""
        if problems:
            toasts.warn(f"Settings not saved: {'; '.join(problems.values())}")
        return bool(problems)

    def store_settings(self, tab: Tab, conv_id: int, settings: ChatSettings) -> None:
        """Write valid settings to a stored chat (its backend kept); a chat deleted meanwhile is
        left (the tab turns to a new chat if it showed it)."""
        try:
            stored = self.store.get(conv_id).settings
            settings = with_backend_of(settings, stored)
            if stored != settings:
                self.store.update_settings(conv_id, settings)
            self.note_fields(tab, conv_id, settings=settings)
        except NotFoundError:
            if tab.conv_id == conv_id:
                tab.conv_id = None

    def settings_layout(self) -> SimpleNamespace:
        """The chat's settings: ``fields`` in SETTING_FIELDS' order, ``boxes`` by field name."""
        backend = self.backend_layout()
        boxes = self.setting_boxes(self.store.default_settings())
        gr.Markdown(
            "Settings apply to this chat once you leave a box (or press Enter) or let go of a slider.",
            elem_classes="hint",
        )
        fields = [boxes[name] for name in SETTING_FIELDS]
        return SimpleNamespace(
            fields=fields,
            boxes=dict(zip(SETTING_FIELDS, fields)),
            thinking=boxes["thinking"],
            backend=backend,
        )

    def backend_layout(self) -> gr.Radio:
        """Where the chat's replies come from: shown when the app has a local engine and a remote
        (--remote URL --local)."""
        backends = self.source.backends
        return gr.Radio(
            choices=[(source.label, name) for name, source in backends.items()],
            value=next(iter(backends)),
            label="Replies from (this chat)",
            elem_id="backend",
            visible=len(backends) > 1,
            interactive=True,
        )

    @staticmethod
    def setting_boxes(d: ChatSettings) -> dict[str, Any]:
        """A box for each setting, by field name, showing the defaults ``d``; laid out in this
        order (the form's is SETTING_FIELDS'): the penalty beside the other sampling settings."""
        system_prompt = gr.Textbox(
            label="System prompt", value=d.system_prompt, lines=3, elem_id="system-prompt"
        )
        temperature = gr.Slider(
            0,
            2,
            value=d.temperature,
            step=0.05,
            label="Temperature",
            elem_id="temperature",
            info="0 = greedy: the likeliest word each time",
        )
        top_p = gr.Slider(
            0.05,
            1,
            value=d.top_p,
            step=0.05,
            label="Top-p",
            elem_id="top-p",
            info="1 = off. Lower: only the likeliest words are drawn",
        )
        # no precision=0: Gradio would round a typed 2.5 before form_settings sees it, and save
        # 2 while the box shows 2.5; form_settings refuses a fraction with a sentence instead
        max_tokens = gr.Number(label="Max tokens", value=d.max_tokens, step=1, elem_id="max-tokens")
        repetition_penalty = gr.Slider(
            1,
            REPETITION_PENALTY_MAX,
            value=d.repetition_penalty,
            step=0.01,
            # a short label: a long one wrapped and squeezed the number box to ~80 px
            label="Repeat penalty",
            elem_id="repetition-penalty",
            info="1 = off. Higher: the model repeats itself less (small models loop without one)",
        )
        thinking = gr.Checkbox(
            label="Thinking mode", value=d.thinking, visible=False, elem_id="thinking"
        )
        top_k = gr.Number(label="Top-k (0 = off)", value=d.top_k, step=1, elem_id="top-k")
        seed = gr.Number(label="Seed (empty = random)", value=d.seed, step=1, elem_id="seed")
        stop = gr.Textbox(
            label="Stop strings (one per line)", value="", lines=2, elem_id="stop-strings"
        )
        context_policy = gr.Radio(
            choices=[
                ("Drop the oldest turns (the system prompt stays)", DROP_OLDEST),
                ("Stop and say so", STOP_AT_CONTEXT),
            ],
            value=d.context_policy,
            label="When the chat is longer than the model's context",
            elem_id="context-policy",
            interactive=True,
        )
        return dict(
            system_prompt=system_prompt,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            repetition_penalty=repetition_penalty,
            thinking=thinking,
            top_k=top_k,
            seed=seed,
            stop=stop,
            context_policy=context_policy,
        )

    def wire_settings(self, w: Wiring) -> None:
        """A box is saved when committed, not on every key: a box when left (PAGE_JS: or on
        Enter), a slider let go. Stamped (STAMP_JS): a box that a click on another chat leaves is
        saved to the chat shown before."""
        c, s = w.chats, w.settings

        async def settings_from_page(
            request: gr.Request, *, clicked_at: float | None, **form: Any
        ) -> tuple:
            return await self.settings_changed(SettingsForm(**form), clicked_at, request)

        for box in s.fields:
            committed = (
                box.release
                if isinstance(box, gr.Slider)
                else box.input
                if isinstance(box, (gr.Checkbox, gr.Radio))
                else box.blur
            )
            committed(
                settings_from_page,
                inputs_kwargs=w.form_then(clicked_at=c.clicked_at),
                outputs=s.fields,
                js=STAMP_JS,
                api_name="settings_changed",
                **QUICK,
            )
        s.backend.input(self.backend_changed, inputs=s.backend, **QUICK).then(**w.follow)
