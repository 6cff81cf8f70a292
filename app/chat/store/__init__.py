"""The conversation store: chats, their messages and per-conversation settings in one SQLite file.

A conversation is a tree of messages; the chat shown is the path from the root to its selected
leaf (schema.py says how the tables hold it). The package, from the bottom up:

- ``records``: the dataclasses handed out and taken in (Conversation, Message, ChatSettings,
  MessageStats, ConversationSummary), their checks and text helpers; no database.
- ``database``: where the file lives and its private permissions; a connection to it.
- ``schema``: the tables, their migrations, and opening an older or newer file.
- ``base``: StoreBase, the open file and its read and write transactions.
- ``rows`` and ``tree``: rows read as records; queries on the tree (the shown path, versions,
  branches), each inside the caller's transaction.
- ``conversations``, ``messages``, ``search``, ``tool_servers``, ``import_export`` (with ``import_file``, which
  checks a file before anything is stored): the store's methods by concern, one mixin each.
- ``conversation_store``: ConversationStore, composed of those mixins.

Each module imports only those above it in this list (tests/unit/test_store.py checks it).

The names other modules use are exported here.
"""

from .conversation_store import ConversationStore
from .database import APP_NAME, BUSY_TIMEOUT_S, DATA_DIR_ENV, DB_NAME, data_dir, default_path
from .import_file import EXPORT_FORMAT, IMPORT_LIMIT_BYTES, IMPORT_TITLE_LIMIT, BadImportFile
from .records import (
    CONTEXT_POLICIES,
    DEFAULT_REPETITION_PENALTY,
    DEFAULT_TITLE,
    DROP_OLDEST,
    MAX_TOKENS_LIMIT,
    REPETITION_PENALTY_MAX,
    ROLES,
    STOP_AT_CONTEXT,
    STOP_STRINGS_LIMIT,
    SYSTEM_PROMPT_LIMIT,
    TITLE_LENGTH,
    ChatSettings,
    Conversation,
    ConversationSummary,
    Message,
    MessageStats,
    NotFoundError,
    StatsLike,
    ToolCallRecord,
    ToolServerRecord,
    default_settings,
    plural,
    shown_value,
    title_from,
)
from .schema import MIGRATIONS, SCHEMA_VERSION, SchemaTooNewError
from .search import SNIPPET_TOKENS

__all__ = [
    "APP_NAME",
    "BUSY_TIMEOUT_S",
    "CONTEXT_POLICIES",
    "DATA_DIR_ENV",
    "DB_NAME",
    "DEFAULT_REPETITION_PENALTY",
    "DEFAULT_TITLE",
    "DROP_OLDEST",
    "EXPORT_FORMAT",
    "IMPORT_LIMIT_BYTES",
    "IMPORT_TITLE_LIMIT",
    "MAX_TOKENS_LIMIT",
    "MIGRATIONS",
    "REPETITION_PENALTY_MAX",
    "ROLES",
    "SCHEMA_VERSION",
    "SNIPPET_TOKENS",
    "STOP_AT_CONTEXT",
    "STOP_STRINGS_LIMIT",
    "SYSTEM_PROMPT_LIMIT",
    "TITLE_LENGTH",
    "BadImportFile",
    "ChatSettings",
    "Conversation",
    "ConversationStore",
    "ConversationSummary",
    "Message",
    "MessageStats",
    "NotFoundError",
    "SchemaTooNewError",
    "StatsLike",
    "ToolCallRecord",
    "ToolServerRecord",
    "data_dir",
    "default_path",
    "default_settings",
    "plural",
    "shown_value",
    "title_from",
]
