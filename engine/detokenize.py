"""Incremental detokenization: token ids to text as they arrive, never emitting half of a
character, with stop strings held back until decided. Used by the detokenizer process and by
``minisgl-chat generate``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DecodeState:
    """One request's text so far. ``prefix_offset..read_offset`` is a window of tokens already
    turned into text, re-decoded together with the new ones so that tokenizers which merge
    spaces or bytes across tokens produce the same text as decoding everything at once."""

    stop: list[str]
    prompt_tokens: int
    ids: list[int] = field(default_factory=list)
    prefix_offset: int = 0
    read_offset: int = 0
    held: str = ""  # decoded text not sent yet because it may be the start of a stop string

    def push(self, tokenizer, token: int) -> str:
        """Append a token; return the newly complete text (may be empty)."""
        self.ids.append(token)
        if tokenizer is None:
            return ""
        before = tokenizer.decode(
            self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True
        )
        after = tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing new, or half of a multi-byte character
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]

    def flush(self, tokenizer) -> str:
        """At the end: whatever is still pending, even an incomplete character."""
        if tokenizer is None or self.read_offset == len(self.ids):
            return ""
        before = tokenizer.decode(
            self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True
        )
        after = tokenizer.decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        self.read_offset = len(self.ids)
        return after[len(before) :]

    def apply_stop(self, new_text: str, final: bool) -> tuple[str, bool]:
        """(text safe to send now, whether a stop string was found). Text that could be the
        beginning of a stop string is held back until it is decided."""
        text = self.held + new_text
        if not self.stop:
            self.held = ""
            return text, False
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:
            self.held = ""
            return text[:cut], True
        if final:
            self.held = ""
            return text, False
        keep = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False


def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as the printable character that spells it in a
    byte-level BPE vocabulary (printable Latin-1 bytes as themselves, the others shifted past
    U+0100)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    chars: dict[int, str] = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + shifted)
            shifted += 1
    return chars


class TokenBytes:
    """Each token's own bytes and text, as OpenAI's logprobs list them (a token may be part of a
    multi-byte character: its text then shows U+FFFD, its bytes are exact). Cached per id."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, tuple[str, list[int]]] = {}
        self.byte_of_char: dict[str, int] | None = None
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        if type(decoder).__name__ == "ByteLevel":  # GPT-2-style: each byte is spelled as one char
            self.byte_of_char = {char: byte for byte, char in byte_level_chars().items()}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        found = self.cache.get(token_id)
        if found is None:
            data = self._bytes(token_id)
            found = self.cache[token_id] = (data.decode("utf-8", errors="replace"), list(data))
        return found

    def _bytes(self, token_id: int) -> bytes:
        if self.tokenizer is None:
            return b""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if self.byte_of_char is not None and all(c in self.byte_of_char for c in piece):
                return bytes(self.byte_of_char[c] for c in piece)
            if (
                len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
            ):  # SentencePiece byte fallback
                return bytes([int(piece[3:5], 16)])
            if (
                "\u2581" in piece
            ):  # SentencePiece / Metaspace: "▁" is the space decode() would drop at the start
                return piece.replace("\u2581", " ").encode()
        return self.tokenizer.decode([token_id]).encode()
