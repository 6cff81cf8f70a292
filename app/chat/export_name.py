"""An exported chat's file name, made from its title."""

from __future__ import annotations

import re

# A word of an export's file name: letters and digits of any script, with the "-", "_", "." or
# "'" inside it kept (gpt-4, my_notes, v1.2, don't)
_NAME_WORD = re.compile(r"[^\W_]+(?:[-_.'][^\W_]+)*")
EXPORT_NAME_LENGTH = 80


# A pair of HTML tags around text ("<b>Plan</b>") is markup: its text stays, the tags' name goes (it
# made "b Plan b"); a tag alone ("what does the <div> tag do") is what the title is about
_TAG_PAIR = re.compile(r"<([A-Za-z][A-Za-z0-9]*)\b[^<>]*>(.*?)</\1\s*>", re.S)


def export_stem(title: str) -> str:
    """An exported chat's file name, without its extension: the readable words of its title, one
    space between them ("**Plan** 🚀" is "Plan"; markup, emoji and punctuation are left out, where
    each became a "_"), cut at a word within EXPORT_NAME_LENGTH; "chat" when no word is left."""
    pairs_taken_out = 1
    while pairs_taken_out:  # from the outside in: "<b><i>x</i></b>"
        title, pairs_taken_out = _TAG_PAIR.subn(r" \2 ", title)
    stem = ""
    for word in _NAME_WORD.findall(title):
        longer = f"{stem} {word}" if stem else word
        if len(longer) > EXPORT_NAME_LENGTH:
            stem = stem or word[:EXPORT_NAME_LENGTH]
            break
        stem = longer
    return stem or "chat"
