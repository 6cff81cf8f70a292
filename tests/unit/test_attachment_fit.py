"""Files that make a message too long for the model's context: how long they are, how much of
them fits, and their first part cut to fit (app/chat/attachment_fit.py), with a stand-in count
of one token per four characters of the message (plus ten for the template and system prompt)."""

from __future__ import annotations

from minisgl_app.chat.attachment_fit import FIRST_PART, first_chars, first_part
from minisgl_app.chat.composing import with_attachments

CONTEXT, ROOM = 1000, 200  # 800 tokens for the prompt


def count(message: str) -> int:
    return len(message) // 4 + 10


def test_files_that_fit_are_sent_as_they_are():
    assert first_part("Summarise.", [("a.txt", "x" * 2000)], count, CONTEXT, ROOM) is None


def test_a_file_too_long_is_cut_to_the_most_of_its_start_that_fits():
    body = "".join(f"line {i}\n" for i in range(2000))
    found = first_part("Summarise.", [("a.txt", body)], count, CONTEXT, ROOM)
    bare = count(with_attachments("Summarise.", []))
    assert found.file_tokens == count(with_attachments("Summarise.", [("a.txt", body)])) - bare
    [(name, cut)] = found.cut
    assert name == "a.txt" + FIRST_PART and body.startswith(cut)
    sent = count(with_attachments("Summarise.", found.cut))
    assert sent <= CONTEXT - ROOM and found.fitting == sent - bare
    one_more = [("a.txt" + FIRST_PART, body[: len(cut) + 1])]
    assert count(with_attachments("Summarise.", one_more)) > CONTEXT - ROOM, "the most that fits"
    assert (found.context_len, found.reply_room) == (CONTEXT, ROOM)
    assert found.notice(["a.txt"]) == (
        f"⚠ **a.txt** is {found.file_tokens:,} tokens, too long for the model: {found.fitting:,} of "
        "them fit (its context is 1,000 tokens: 200 kept for the reply, the rest for your "
        "message and the system prompt)."
    )


def test_several_files_keep_the_first_whole_cut_the_one_at_the_limit_and_drop_the_rest():
    files = [("a.txt", "a" * 1000), ("b.txt", "b" * 5000), ("c.txt", "c" * 1000)]
    found = first_part("", files, count, CONTEXT, ROOM)
    assert [name for name, _ in found.cut] == ["a.txt", "b.txt" + FIRST_PART]
    assert found.cut[0] == files[0] and set(found.cut[1][1]) == {"b"}
    assert first_chars(files, 1500) == [("a.txt", "a" * 1000), ("b.txt" + FIRST_PART, "b" * 500)]
    assert first_chars(files, 6000) == files[:2], "a file cut at its end is whole"


def test_a_typed_message_too_long_without_its_files_is_not_the_files_fault():
    assert first_part("q" * 4000, [("a.txt", "x" * 10)], count, CONTEXT, ROOM) is None
