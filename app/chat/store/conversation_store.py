"""ConversationStore: the one object the app keeps its chats through."""

from __future__ import annotations

from .conversations import ConversationsMixin
from .import_export import ImportExportMixin
from .messages import MessagesMixin
from .search import SearchMixin
from .tool_servers import ToolServersMixin


class ConversationStore(
    ConversationsMixin, MessagesMixin, SearchMixin, ImportExportMixin, ToolServersMixin
):
    """Conversations on disk. Safe to share between threads; several processes may open one file.

    Each concern lives in its own mixin over StoreBase (the open file and its transactions):
    conversations, messages in the tree, search, import and export, the MCP tool servers. A streamed reply is appended
    once and then updated as it grows; its last update is what the user saw, a stopped reply
    included.
    """
