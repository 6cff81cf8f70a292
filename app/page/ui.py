"""The chat page (Gradio), mounted on the same FastAPI app as the OpenAI routes (mount.py).

The page is a view. Each tab has a :class:`~.tabs.Tab` on the server saying which conversation it
shows; one long-running ``follow`` event per tab renders that conversation (stored messages plus
the live reply, app/chat/view.py) whenever anything changes (following.py). Replies run apart from
the page (app/chat/live.py), so the chat shown is always the one selected, whatever streams
elsewhere.

Every other event changes state (the store, the tab, the replies) and returns quickly; a refused
action says why in a toast (toasts.py) and leaves the page as it was. Each panel is a module with
its handlers, its layout (``*_layout``) and its events (``wire_*``); :class:`ChatPage` composes
them. The UI talks to the engine only through the front end's ``FrontendClient.generate``.
"""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from ..chat.live import ReplyManager
from ..chat.reply_source import ModelEntry, ReplySource
from ..chat.store import ConversationStore
from ..chat.tool_loop import ToolBox
from ..chat.uploads import Uploads
from ..model_pull import ModelPuller
from .attachments import Attachments
from .chat_files import ChatFiles
from .chats_panel import ChatsPanel
from .composer import Composer
from .drafts import Drafts
from .following import ViewEvents
from .gradio_patches import check_uploads_as_launched, let_sliders_take_typed_values
from .message_edits import MessageEdits
from .models_panel import ModelsPanel
from .rendering import Rendering
from .settings_panel import SettingsPanel
from .tabs import LeftFiles, Tab
from .ticks import Ticks
from .tools_panel import ToolsPanel
from .turns import ReplyTurns
from .versions_panel import VersionsPanel
from .wiring import Wiring


class ChatPage(
    ViewEvents,  # the view: the follow, the load (following.py)
    Ticks,
    Rendering,
    ChatsPanel,  # the sidebar's chats (chats_panel.py)
    ChatFiles,
    Drafts,
    SettingsPanel,
    Composer,  # the message box and the chat's buttons (composer.py)
    MessageEdits,
    ReplyTurns,
    Attachments,
    VersionsPanel,
    ModelsPanel,
    ToolsPanel,  # MCP servers, the chat's tools, a call's approval (tools_panel.py)
):
    """The page's state and event handlers, one part each (a panel, or a concern of one: the
    panel first, then what it is made of); ``build`` lays it out."""

    def __init__(
        self, source: ReplySource, store: ConversationStore, puller: ModelPuller | None = None
    ) -> None:
        self.source = source  # where replies come from: the local engine or a remote server
        self.store = store
        self.puller = puller  # pulls models onto this machine (None: a remote engine's models are the remote's)
        self.listed: dict[str, ModelEntry] = {}  # the models panel's last listing, by model name
        self.replies = ReplyManager(store, source.generate)
        self.toolbox = ToolBox()  # the MCP servers added in the Tools panel, once started
        self.tabs: dict[str, Tab] = {}
        # the files attached in tabs that closed, until a reload of their browser tab takes them
        self.left_files: dict[str, LeftFiles] = {}
        self.uploads = (
            Uploads()
        )  # the files Attach and Import may read (build: Gradio's upload list)

    def build(self) -> gr.Blocks:
        """The page: a sidebar (chats, settings, models, tools) beside the chat, then its events."""
        with gr.Blocks(title="minisgl-chat", fill_height=True) as demo:
            with gr.Row(equal_height=False):
                with gr.Column(scale=1, min_width=220, elem_id="sidebar"):
                    # on a phone the sidebar is a bar above the chat: ☰ Chats opens the rest (PAGE_JS, css.NARROW)
                    with gr.Row(elem_id="sidebar-bar"):
                        gr.Button("☰ Chats", elem_id="chats-toggle", scale=0, min_width=110)
                        new_btn = gr.Button(
                            "＋ New chat", elem_id="new-chat-btn", variant="secondary"
                        )
                    with gr.Column(elem_id="sidebar-body"):
                        chats = self.chats_layout(new_btn)
                        with gr.Accordion("Settings", open=False, elem_id="settings"):
                            settings = self.settings_layout()
                        with gr.Accordion("Models", open=False, elem_id="models") as models_box:
                            models = self.models_layout()
                            models.box = models_box
                        with gr.Accordion("Tools", open=False, elem_id="tools") as tools_box:
                            tools = self.tools_layout()
                            tools.box = tools_box
                # the sidebar a quarter of the row (~300 px at 1280): at a fifth (238 px) a chat's title shows ~14 letters
                with gr.Column(scale=3, elem_id="main"):
                    main = self._chat_column()
            self._wire(demo, chats, settings, models, main, tools)
        self.uploads.stored = getattr(
            demo, "upload_file_set", set()
        )  # filled by Gradio's upload route
        check_uploads_as_launched(demo)
        return demo

    def _chat_column(self) -> SimpleNamespace:
        """The chat, the versions bar, the message box and the files attached to it."""
        parts = (
            self.chat_layout(),
            self.continue_layout(),
            self.approval_layout(),
            self.versions_layout(),
            self.composer_layout(),
            self.attachments_layout(),
            self.signals_layout(),
        )
        return SimpleNamespace(
            **{name: component for part in parts for name, component in vars(part).items()}
        )

    def _wire(
        self,
        demo: gr.Blocks,
        chats: SimpleNamespace,
        settings: SimpleNamespace,
        models: SimpleNamespace,
        main: SimpleNamespace,
        tools: SimpleNamespace,
    ) -> None:
        """Every event of the page: what each control calls, and the follow that renders after it."""
        w = Wiring(
            chats=chats,
            settings=settings,
            models=models,
            main=main,
            follow_fn=self.follow,
            attachments_note_fn=self.attachments_note,
            tools=tools,
        )
        self.wire_view(demo, w)
        self.wire_models(w)
        self.wire_chats(w)
        self.wire_settings(w)
        self.wire_composer(w)
        self.wire_attachments(w)
        self.wire_versions(w)
        self.wire_tools(demo, w)


def chat_page(
    source: ReplySource, store: ConversationStore, puller: ModelPuller | None = None
) -> ChatPage:
    """The page's state and handlers, its replies written by ``source`` (reply_source.py), with a
    Pull in its models panel when given a ``puller``; ``.build()`` lays it out."""
    let_sliders_take_typed_values()
    return ChatPage(source, store, puller)


def build_ui(
    source: ReplySource, store: ConversationStore, puller: ModelPuller | None = None
) -> gr.Blocks:
    """The whole page (``chat_page``'s layout)."""
    return chat_page(source, store, puller).build()
