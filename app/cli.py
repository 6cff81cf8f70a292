"""``minisgl-chat``: the command line. Every subcommand reports a problem the user can fix as
one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from minisgl_engine import (
    UserError,
    add_bench_args,
    add_engine_args,
    engine_config_from_args,
    is_loopback,
)

from .bench_footprint import add_footprint_bench_args
from .bench_page import add_page_bench_args


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + error
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def comma_list(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """The server's flags, then those of running the --tp ranks over several machines."""
    _add_http_flags(parser.add_argument_group("server"))
    machines = parser.add_argument_group(
        "several machines (trusted network only: the rendezvous port is unauthenticated)"
    )
    _add_multi_node_flags(machines)


def _add_http_flags(g: argparse._ArgumentGroup) -> None:
    """Where the server listens, who may call it, what a request may bring."""
    g.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: %(default)s; any other needs --api-key)",
    )
    g.add_argument("--port", type=int, default=1919, help="default: %(default)s")
    g.add_argument(
        "--api-key",
        default=None,
        help="require `Authorization: Bearer KEY` on /v1/* (env MINISGL_API_KEY)",
    )
    g.add_argument(
        "--num-tokenizer", type=int, default=1, help="tokenizer processes (default: %(default)s)"
    )
    g.add_argument(
        "--allowed-hosts",
        type=comma_list,
        default=(),
        metavar="NAME,...",
        help="more Host names to answer to (e.g. a LAN name or a reverse proxy's); loopback names and --host always are",
    )
    g.add_argument(
        "--allowed-origins",
        type=comma_list,
        default=(),
        metavar="ORIGIN,...",
        help="web pages allowed to call the API from the browser, e.g. http://localhost:3000 (CORS for exactly those)",
    )
    g.add_argument(
        "--served-model-name",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME",
        help="the names requests' `model` may give (repeatable or comma-separated; the first is listed by /v1/models "
        "and echoed in replies; any other model is a 404). Default: the name of --model",
    )
    g.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let chat requests bring their own chat template (chat_template, chat_template_kwargs.chat_template): "
        "a template is code the tokenizer runs; without this flag such a request is a 400",
    )
    g.add_argument(
        "--max-request-bytes",
        type=int,
        default=8 * 1024 * 1024,
        metavar="N",
        help="the largest request body /v1 reads; a larger one is a 413 (default: %(default)s, 8 MiB)",
    )


def _add_multi_node_flags(g: argparse._ArgumentGroup) -> None:
    """The --tp ranks spread over several machines."""
    g.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="machines the --tp ranks are spread over (default: %(default)s)",
    )
    g.add_argument(
        "--node-rank",
        type=int,
        default=0,
        help="this machine's index; 0 runs the front end (default: %(default)s)",
    )
    g.add_argument(
        "--dist-init-addr",
        default=None,
        metavar="HOST:PORT",
        help="where rank 0 (on node 0) meets the other ranks",
    )


def server_config_from_args(args: argparse.Namespace):
    import os

    from minisgl_engine import ServerConfig, check_server_config

    names = dict.fromkeys(
        name for value in args.served_model_name for name in comma_list(value)
    )  # in order, once each
    server = ServerConfig(
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("MINISGL_API_KEY") or None,
        num_tokenizers=args.num_tokenizer,
        allowed_hosts=args.allowed_hosts,
        allowed_origins=args.allowed_origins,
        served_model_names=tuple(names),
        trust_request_chat_template=args.trust_request_chat_template,
        max_request_bytes=args.max_request_bytes,
    )
    check_server_config(
        server
    )  # a wrong flag is said at once, before the engine's and the page's imports
    return server


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="minisgl-chat", description="A local chat app with its own LLM serving engine."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log engine progress")
    sub = parser.add_subparsers(dest="command", parser_class=ArgumentParser)
    _add_generate_command(sub)
    _add_chat_command(sub)
    _add_serve_command(sub)
    _add_pull_command(sub)
    _add_bench_command(sub)
    return parser


def _add_generate_command(sub: argparse._SubParsersAction) -> None:
    """``generate PROMPT``: one reply in the terminal."""
    gen = sub.add_parser("generate", help="answer one prompt in the terminal (streams the reply)")
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    # the sampling seed; not EngineConfig.seed (the seed of --dummy-weights), which it would set through vars(args)
    gen.add_argument(
        "--seed",
        dest="sample_seed",
        type=int,
        default=None,
        help="seed of the sampling (default: random)",
    )
    gen.add_argument(
        "--no-chat-template", action="store_true", help="send the prompt as plain text"
    )
    add_engine_args(gen)


def _add_chat_command(sub: argparse._SubParsersAction) -> None:
    """``chat``: the app, with the remote-engine flags, the server's and the engine's."""
    chat = sub.add_parser(
        "chat", help="the chat app (the default command): engine + chat page + OpenAI routes"
    )
    chat.add_argument("--no-browser", action="store_true", help="do not open the browser")
    chat.add_argument(
        "--no-auth",
        action="store_true",
        help="serve the chat page without its key: every user and program on this machine can then read, "
        "change and delete your chats (loopback only; docs/security.md)",
    )
    remote = chat.add_argument_group(
        "remote engine (no local engine: replies come from an OpenAI-compatible server)"
    )
    remote.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="e.g. http://gpu-box:30000 (SGLang, vLLM or another minisgl-chat serve); docs/scale-out.md",
    )
    remote.add_argument(
        "--remote-api-key",
        default=None,
        metavar="KEY",
        help="the remote's API key (env MINISGL_REMOTE_API_KEY)",
    )
    remote.add_argument(
        "--remote-model",
        default=None,
        metavar="NAME",
        help="the remote model to ask (default: the first it lists)",
    )
    remote.add_argument(
        "--local",
        action="store_true",
        help="with --remote: run this machine's engine too (the engine flags apply to it); "
        "each chat picks where its replies come from (Settings > Replies from)",
    )
    add_server_args(chat)
    add_engine_args(chat)


def _add_serve_command(sub: argparse._SubParsersAction) -> None:
    """``serve``: the OpenAI-compatible server alone."""
    serve = sub.add_parser("serve", help="headless OpenAI-compatible server (no UI)")
    add_server_args(serve)
    add_engine_args(serve)


def _add_pull_command(sub: argparse._SubParsersAction) -> None:
    """``pull [MODEL]``: download and convert a model once."""
    pull = sub.add_parser(
        "pull", help="download and convert a model once (default: the demo model)"
    )
    pull.add_argument("model", nargs="?", default="demo")
    pull.add_argument(
        "--json-progress",
        action="store_true",
        help="progress and outcome as JSON lines on stdout (the chat page's pull reads them)",
    )


def _add_bench_command(sub: argparse._SubParsersAction) -> None:
    """``bench``: the engine's benchmarks and the app's own (``page``, ``footprint``)."""
    bench = sub.add_parser("bench", help="benchmarks, side by side with Hugging Face transformers")
    benches = add_bench_args(bench, ArgumentParser)
    page = benches.add_parser(
        "page",
        help="a reply's tok/s in the chat page against the same reply through the API (Chromium)",
    )
    add_page_bench_args(page)
    footprint = benches.add_parser(
        "footprint",
        help="the app's memory (RSS/PSS per process) idle and in a long chat, "
        "and its time to ready",
    )
    add_footprint_bench_args(footprint)


def cmd_generate(args: argparse.Namespace) -> int:
    from minisgl_engine import LLM, SamplingParams

    config = engine_config_from_args(args)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sample_seed,
    )
    llm = LLM(config=config)
    if llm.tokenizer is None:
        raise UserError("this model has no tokenizer; pass --tokenizer PATH")

    from minisgl_engine import DecodeState

    state = DecodeState(stop=[], prompt_tokens=0)
    for _, token, finish in llm.stream(args.prompt, params, chat=not args.no_chat_template):
        text = state.push(llm.tokenizer, token) if token is not None else ""
        if finish is not None:
            text += state.flush(llm.tokenizer)
        sys.stdout.write(text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from minisgl_engine import run_server

    logging.getLogger("minisgl").setLevel(logging.INFO)
    return run_server(engine_config_from_args(args), server_config_from_args(args))


def engine_flags_given(args: argparse.Namespace) -> list[str]:
    """The engine flags (``add_engine_args``) set to something other than their defaults."""
    probe = argparse.ArgumentParser(add_help=False)
    add_engine_args(probe)
    return [
        a.option_strings[0]
        for a in probe._actions
        if a.option_strings and a.dest != "help" and getattr(args, a.dest, a.default) != a.default
    ]


def cmd_chat(args: argparse.Namespace) -> int:
    """The app: engine + chat page + OpenAI routes on one server, opened in the browser."""
    files = (
        private_files_dir()
    )  # before Gradio is imported: some of its modules read the folder then
    try:
        return run_chat(args)
    finally:
        shutil.rmtree(files, ignore_errors=True)


def check_remote_flags(args: argparse.Namespace) -> None:
    """--remote, --local and the engine flags must make sense together (said before the app's
    imports: Gradio's alone takes seconds)."""
    if args.remote is None:
        if args.local:
            raise UserError(
                "--local goes with --remote URL (this machine's engine runs anyway without --remote); drop --local"
            )
        return
    if not args.remote.strip().lower().startswith(("http://", "https://")):
        from .chat.reply_source import without_credentials

        raise UserError(
            f"--remote must be an http:// or https:// URL, got {without_credentials(args.remote)!r}"
        )
    given = engine_flags_given(args)
    if given and not args.local:
        raise UserError(
            f"--remote runs no local engine, so {', '.join(given)} would do nothing; drop "
            f"{'it' if len(given) == 1 else 'them'} (the remote server chooses its own model and settings), "
            "or add --local to run this machine's engine beside the remote"
        )


def run_chat(args: argparse.Namespace) -> int:
    check_remote_flags(args)
    server = server_config_from_args(args)
    if args.no_auth and not is_loopback(server.host):
        raise UserError(
            f"--no-auth is for a page on this machine only (--host 127.0.0.1); on {server.host} the page "
            "needs its key: drop --no-auth"
        )
    from minisgl_engine import run_server

    from .chat.reply_source import RemoteEngine
    from .chat.store import ConversationStore

    # The page's modules (Gradio: seconds to import) are imported by `mount`, once the engine's
    # workers are starting, so the two overlap.
    logging.getLogger("minisgl").setLevel(logging.INFO)
    store = ConversationStore()
    page_key = None
    if args.no_auth:
        warn_no_auth()
    # the page's key is read by `mount` (its module imports Gradio), before the app listens
    on_listen, on_ready = page_announcements(args, store.path.parent, lambda: page_key)

    remote = None
    if args.remote is not None:
        remote = RemoteEngine(
            args.remote,
            args.remote_api_key or os.environ.get("MINISGL_REMOTE_API_KEY"),
            args.remote_model,
        )
        if not args.local:  # no engine here: the page's replies come from that server
            from .page.access import load_page_key
            from .remote_app import run_remote_chat

            page_key = None if args.no_auth else load_page_key(store.path.parent)
            return run_remote_chat(remote, server, store, on_listen, page_key)

    def mount(app, client, engine) -> None:
        nonlocal page_key
        from .chat.reply_source import LocalEngine, SideBySide
        from .model_pull import ModelPuller
        from .page import mount_ui
        from .page.access import load_page_key

        page_key = None if args.no_auth else load_page_key(store.path.parent)
        local = LocalEngine(client, engine)
        mount_ui(
            app,
            local if remote is None else SideBySide(local, remote),
            store,
            server.api_key,
            ModelPuller(),
            page_key,
        )

    return run_server(
        engine_config_from_args(args), server, mount=mount, on_listen=on_listen, on_ready=on_ready
    )


def warn_no_auth() -> None:
    print(
        "minisgl-chat: WARNING: --no-auth: the chat page needs no key; every user and program on this machine "
        "can read, change and delete your chats",
        file=sys.stderr,
        flush=True,
    )


def page_announcements(
    args: argparse.Namespace, data_dir: Path, key: Callable[[], str | None]
) -> tuple[Callable[[str], None], Callable[[str], None]]:
    """What the app says on the terminal once it listens (the page's link, with its key, which
    ``key()`` gives by then; the browser opened on it unless --no-browser) and once the model is
    ready."""
    import webbrowser

    def on_listen(url: str) -> None:
        from .page.access import page_link, write_open_file

        page_key = key()
        link = page_link(url, page_key)
        print(
            f"minisgl-chat: open {link} in your browser (Ctrl+C quits)", file=sys.stderr, flush=True
        )
        # through a private file: a link on the browser's command line is readable by every user
        if not args.no_browser:
            webbrowser.open(write_open_file(data_dir, link).as_uri() if page_key else link)

    def on_ready(url: str) -> None:
        from .page.access import page_link

        # the last line a person reads names the link that opens the page, not the bare address
        print(
            f"minisgl-chat: the chat is ready: open {page_link(url, key())} in your browser",
            file=sys.stderr,
            flush=True,
        )

    return on_listen, on_ready


def private_files_dir() -> str:
    """A folder only this user can read (0700), removed when the app stops, for the files the
    page hands out or takes in (exports, attachments, imports). Gradio's default is a shared
    /tmp/gradio that keeps every exported chat, readable by other users of the machine."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="minisgl-chat-files-")
    os.environ["GRADIO_TEMP_DIR"] = folder  # read by Gradio when it stores a file
    return folder


def cmd_pull(args: argparse.Namespace) -> int:
    from minisgl_engine import resolve_model

    if args.json_progress:
        from .model_pull import run_pull

        return run_pull(args.model)
    print(resolve_model(None if args.model == "demo" else args.model))
    return 0


COMMANDS = ("chat", "generate", "serve", "pull", "bench")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `minisgl-chat [options]` with no command is the chat app
    lead = 1 if argv[:1] in (["-v"], ["--verbose"]) else 0
    if not any(a in COMMANDS for a in argv[lead : lead + 1]) and not set(argv) & {"-h", "--help"}:
        argv.insert(lead, "chat")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    logging.getLogger("minisgl").setLevel(logging.INFO if args.verbose else logging.WARNING)
    if not args.verbose:  # transformers' config warnings would bury our one-line errors
        logging.getLogger("transformers").setLevel(logging.ERROR)
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        if args.command == "generate":
            return cmd_generate(args)
        if args.command == "chat":
            return cmd_chat(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "pull":
            return cmd_pull(args)
        if args.command == "bench" and args.bench == "page":
            from .bench_page import run_page_bench

            return run_page_bench(args)
        if args.command == "bench" and args.bench == "footprint":
            from .bench_footprint import run_footprint_bench

            return run_footprint_bench(args)
        if args.command == "bench":
            from minisgl_engine import run_bench

            return run_bench(args)
        parser.print_help()
        return 0
    except UserError as exc:
        print(f"minisgl-chat: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
