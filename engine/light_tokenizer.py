"""A model's tokenizer from its ``tokenizer.json`` (the ``tokenizers`` library) and its chat
template (``chat_template``), without torch or transformers: what the tokenizer and
detokenizer workers run, so that each is a small process.

It follows what transformers' fast tokenizer does with the same files: the special tokens named
in ``tokenizer_config.json`` (``bos_token``, ``eos_token``, … and the extra ones) are added to
the vocabulary as special tokens if ``tokenizer.json`` lacks them; ``tokenizer.json``'s own
post-processor decides what ``encode`` adds around a text (transformers ignores the config's
``add_bos_token`` when a ``tokenizer.json`` is there); a chat prompt is encoded without
special tokens (the template writes them); ``decode`` skips special tokens on request and cleans
up tokenization spaces only where the config asks it of a non-BPE model. The chat template comes
from ``chat_template.jinja`` (and ``additional_chat_templates/*.jinja``) before the config's
``chat_template``.

Only tokenizers whose transformers class loads ``tokenizer.json`` as it is are read this way
(:data:`AS_FILE_CLASSES`); others (SentencePiece-era classes such as ``LlamaTokenizer``, which
transformers rebuilds with its own pre-tokenizer) and folders without ``tokenizer.json`` use
transformers (``tokenizer.load_text_tokenizer``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from .chat_template import render_chat, select_template

NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

AS_FILE_CLASSES = frozenset(
    {"PreTrainedTokenizer", "TokenizersBackend", "GPT2Tokenizer", "Qwen2Tokenizer"}
)
"""``tokenizer_class`` values (``Fast`` suffix dropped) whose transformers tokenizer is the
``tokenizer.json`` pipeline unchanged (or rebuilt to the same pipeline, tested)."""


def token_text(value: Any) -> str | None:
    """A special token as the config writes it: a string, or an AddedToken's dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def added_token(value: Any) -> AddedToken | None:
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        fields = {k: v for k, v in value.items() if k in ("single_word", "lstrip", "rstrip")}
        return AddedToken(
            value["content"],
            special=True,
            normalized=bool(value.get("normalized", False)),
            **fields,
        )
    if isinstance(value, str):
        return AddedToken(value, special=True, normalized=False)
    return None


def read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def can_load(folder: str | Path) -> bool:
    """Whether ``folder``'s tokenizer is read by :class:`LightTokenizer` (else transformers)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return False
    config = read_json(folder / "tokenizer_config.json")
    cls = config.get("tokenizer_class")
    return cls is None or str(cls).removesuffix("Fast") in AS_FILE_CLASSES


def read_chat_template(folder: Path, config: dict) -> str | dict[str, str] | None:
    """The model's chat template, or its named templates (``default`` among them)."""
    templates: dict[str, str] = {}
    main = folder / "chat_template.jinja"
    if main.is_file():
        templates["default"] = main.read_text(encoding="utf-8")
    extra = folder / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if list(templates) == ["default"]:
        return templates["default"]
    if templates:
        return templates
    found = config.get("chat_template")
    if isinstance(found, (list, tuple)):
        return {item["name"]: item["template"] for item in found}
    return found


class LightTokenizer:
    """The part of transformers' tokenizer interface the engine uses (``tokenizer.TextTokenizer``)."""

    def __init__(self, folder: str | Path) -> None:
        folder = Path(folder)
        self.name_or_path = str(folder)
        config = read_json(folder / "tokenizer_config.json")
        if "added_tokens_decoder" not in config:  # older folders name their special tokens here
            config.update(
                {
                    key: value
                    for key, value in read_json(folder / "special_tokens_map.json").items()
                    if value
                }
            )
        self.backend_tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.backend_tokenizer.no_truncation()  # transformers encodes without either by default
        self.backend_tokenizer.no_padding()
        self.chat_template = read_chat_template(folder, config)
        self.special_tokens_map: dict[str, str] = {
            name: text
            for name in NAMED_SPECIAL_TOKENS
            if (text := token_text(config.get(name))) is not None
        }
        self._add_special_tokens(config)
        self.clean_up_tokenization_spaces = bool(
            config.get("clean_up_tokenization_spaces", False)
        ) and (type(self.backend_tokenizer.model).__name__ != "BPE")

    def _add_special_tokens(self, config: dict) -> None:
        """The config's special tokens that ``tokenizer.json`` lacks, added as transformers adds
        them (in id order of the config's own list, then the named ones, then the extra ones)."""
        present = {
            token.content for token in self.backend_tokenizer.get_added_tokens_decoder().values()
        }
        wanted: list[AddedToken] = []
        decoder = config.get("added_tokens_decoder") or {}
        for _, value in sorted(decoder.items(), key=lambda item: int(item[0])):
            if isinstance(value, dict) and value.get("content") not in present:
                fields = {
                    k: v
                    for k, v in value.items()
                    if k in ("single_word", "lstrip", "rstrip", "normalized", "special")
                }
                wanted.append(AddedToken(value["content"], **fields))
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        extra = list(extra.values()) if isinstance(extra, dict) else list(extra)
        for value in [config.get(name) for name in NAMED_SPECIAL_TOKENS] + extra:
            token = added_token(value)
            if token is not None and token.content not in present:
                if all(token.content != t.content for t in wanted):
                    wanted.append(token)
        if wanted:
            self.backend_tokenizer.add_tokens(wanted)

    # ---- the vocabulary

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        eos = self.eos_token
        return None if eos is None else self.backend_tokenizer.token_to_id(eos)

    def get_vocab(self) -> dict[str, int]:
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self.backend_tokenizer.id_to_token(token_id)

    # ---- text <-> ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: list[int] | int, skip_special_tokens: bool = False) -> str:
        ids = [token_ids] if isinstance(token_ids, int) else list(token_ids)
        text = self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        return clean_up_tokenization(text) if self.clean_up_tokenization_spaces else text

    def apply_chat_template(
        self,
        conversation: list[dict],
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """The chat as a prompt (``tokenize=False``) or its token ids; ``kwargs`` are the
        template's variables, over the special tokens."""
        if return_dict:
            raise ValueError("return_dict is not supported here; ask for the token ids")
        template = select_template(self.chat_template, chat_template, tools)
        prompt = render_chat(
            template,
            list(conversation),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tools=tools,
            documents=documents,
            variables={**self.special_tokens_map, **kwargs},
        )
        return self.encode(prompt, add_special_tokens=False) if tokenize else prompt


def clean_up_tokenization(text: str) -> str:
    """The spaces a WordPiece-style tokenizer leaves before punctuation, removed."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text
