"""minisgl-chat's serving engine (import name ``minisgl_engine``).

Modules import strictly downward: plain data types (``sampling_params``, ``request``, ``batch``)
at the bottom, then ``kvcache`` and ``attention``, ``layers``, ``models``, ``engine``,
``scheduler`` and the offline ``llm`` API on top; ``server`` runs them as processes.

The names below are the engine's public surface: what the chat app (``minisgl_app``) and other
programs use. Each is imported on first use (``from minisgl_engine import LLM`` loads the model
code; ``from minisgl_engine import UserError`` does not load torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it
_PUBLIC = {
    # offline use
    "LLM": ".llm",
    "SamplingParams": ".sampling_params",
    "EngineConfig": ".config",
    "DecodeState": ".detokenize",  # incremental detokenization of a token stream
    "UserError": ".errors",  # a problem the user can fix: one line, exit code 2
    # the command line's engine flags, and the benchmarks
    "add_engine_args": ".args",
    "add_bench_args": ".args",
    "engine_config_from_args": ".args",
    "run_bench": ".benchmarks.bench",
    "resolve_model": ".weights.source",
    "local_models": ".weights.catalog",  # the models on this machine (the chat page's models panel)
    "LocalModel": ".weights.catalog",
    # serving: the front end's client interface and its request and reply types
    "FrontendClient": ".workers.frontend",
    "GenerateRequest": ".workers.frontend",
    "UserReply": ".messages",
    "PromptProgressMsg": ".messages",  # how far a long prompt has been read (the page shows it)
    "ServerConfig": ".api.server",
    "run_server": ".api.server",
    "EngineHost": ".workers.engine_host",  # the workers behind the front end; switches the model
    "check_server_config": ".api.server",
    "is_loopback": ".api.server",
    "bind_listen_socket": ".api.server",
    "install_guard": ".api.security",
    "free_port": ".workers.launcher",
    "exit_when_parent_dies": ".workers.process",  # a helper process of the app (a model pull) ends with it
    # a chat's prompt as the tokenizers make it (the page counts its tokens to fit the context)
    "load_text_tokenizer": ".tokenizer",
    "chat_prompt_ids": ".tokenizer",
    # tools in the chat page's replies: offered as the OpenAI route offers them, calls parsed
    "GrammarSpec": ".sampling_params",
    "ToolCallParser": ".tool_calls",
    "ToolCall": ".tool_calls",
    "with_tool_prompt": ".tool_prompt",
    "DEFAULT_TOOL_FORMAT": ".tool_prompt",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'minisgl_engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


if TYPE_CHECKING:  # for editors and type checkers: the same names, imported eagerly
    from .api.security import install_guard
    from .api.server import (
        ServerConfig,
        bind_listen_socket,
        check_server_config,
        is_loopback,
        run_server,
    )
    from .args import add_bench_args, add_engine_args, engine_config_from_args
    from .benchmarks.bench import run_bench
    from .config import EngineConfig
    from .detokenize import DecodeState
    from .errors import UserError
    from .llm import LLM
    from .messages import PromptProgressMsg, UserReply
    from .sampling_params import GrammarSpec, SamplingParams
    from .tokenizer import chat_prompt_ids, load_text_tokenizer
    from .tool_calls import ToolCall, ToolCallParser
    from .tool_prompt import DEFAULT_TOOL_FORMAT, with_tool_prompt
    from .weights.catalog import LocalModel, local_models
    from .weights.source import resolve_model
    from .workers.engine_host import EngineHost
    from .workers.frontend import FrontendClient, GenerateRequest
    from .workers.launcher import free_port
    from .workers.process import exit_when_parent_dies
