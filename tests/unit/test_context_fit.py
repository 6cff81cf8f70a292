"""A chat longer than the model's context (app/chat/context_fit.py, reply_request.fitted_request):
which turns are dropped, that the system prompt stays, what a message too long alone says, and how
the chat shows it; counted with the demo model's own tokenizer and chat template where it is
pulled (tests/server/test_context_count.py checks those counts against the server's)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from types import SimpleNamespace

import pytest

from minisgl_app.chat.context_fit import (
    DROP_OLDEST,
    STOP_AT_CONTEXT,
    ContextOverflow,
    fit_messages,
    reply_room,
)
from minisgl_app.chat.live import ReplyManager
from minisgl_app.chat.reply_request import fitted_request, reply_request
from minisgl_app.chat.reply_source import LocalEngine
from minisgl_app.chat.store import ChatSettings, ConversationStore
from minisgl_app.chat.view import (
    BEYOND_CONTEXT_LINE,
    OVER_CONTEXT_LINE,
    engine_messages,
    view_messages,
)
from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete


def words(messages: list[dict]) -> int:
    """A stand-in count: one token per word, and two per message for its frame."""
    return sum(len(m["content"].split()) + 2 for m in messages)


class Counted:
    """A count that remembers how many times it was asked."""

    def __init__(self, count) -> None:
        self.count, self.calls = count, 0

    def __call__(self, messages: list[dict]) -> int:
        self.calls += 1
        return self.count(messages)


def chat(turns: int, system: str | None = "be brief", size: int = 10) -> list[dict]:
    msgs = [{"role": "system", "content": system}] if system else []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"q{i} " + "w " * size})
        msgs.append({"role": "assistant", "content": f"a{i} " + "w " * size})
    msgs.append({"role": "user", "content": "last question"})
    return msgs


def most_turns_that_fit(messages: list[dict], count, budget: int) -> list[dict]:
    """The reference: try every number of dropped turns, fewest first."""
    head = 1 if messages[0]["role"] == "system" else 0
    starts = [i for i in range(head, len(messages)) if messages[i]["role"] == "user"]
    for s in starts:
        kept = messages[:head] + messages[s:]
        if count(kept) <= budget:
            return kept
    raise AssertionError("nothing fits")


def test_a_chat_that_fits_is_sent_whole_after_one_count():
    msgs = chat(3)
    count = Counted(words)
    fit = fit_messages(msgs, count, context_len=1000, room=100, policy=DROP_OLDEST)
    assert fit.messages == msgs and fit.dropped == 0 and fit.prompt_tokens == words(msgs)
    assert count.calls == 1


def test_the_oldest_turns_are_dropped_and_the_system_prompt_stays():
    msgs = chat(10)  # 14 tokens a message, 4 for the system prompt, 4 for the last question
    fit = fit_messages(msgs, words, context_len=100, room=20, policy=DROP_OLDEST)
    assert fit.messages[0] == msgs[0]
    assert fit.messages[-1] == msgs[-1]
    assert fit.messages == most_turns_that_fit(msgs, words, 80)
    assert fit.prompt_tokens == words(fit.messages) <= 80
    assert fit.dropped == len(msgs) - len(fit.messages)
    # whole turns: the first message read after the system prompt is a question
    assert fit.messages[1]["role"] == "user" and fit.messages[1]["content"].startswith("q")


def test_without_a_system_prompt_the_last_turns_are_kept():
    msgs = chat(6, system=None)
    fit = fit_messages(msgs, words, context_len=60, room=10, policy=DROP_OLDEST)
    assert fit.messages == most_turns_that_fit(msgs, words, 50)
    assert fit.messages[0]["role"] == "user"


@pytest.mark.parametrize("budget", [8, 20, 50, 333, 1000, 2700])
def test_a_200_turn_chat_drops_exactly_what_it_must_in_few_counts(budget):
    msgs = chat(200, size=5)
    count = Counted(words)
    fit = fit_messages(msgs, count, context_len=budget + 10, room=10, policy=DROP_OLDEST)
    assert fit.messages == most_turns_that_fit(msgs, words, budget)
    assert count.calls <= 2 * 9 + 1  # doubling then halving over 201 turns, not one count a turn


def test_a_message_longer_than_the_context_alone_says_so():
    msgs = chat(2) + [{"role": "user", "content": "long " * 500}]
    with pytest.raises(ContextOverflow) as caught:
        fit_messages(msgs, words, context_len=200, room=50, policy=DROP_OLDEST)
    assert not caught.value.droppable
    text = str(caught.value)
    assert "your message is too long for the model" in text and "shorten it" in text
    assert "150" in text  # what the model reads at most: the context less the reply's room


def test_the_stop_policy_refuses_a_chat_past_the_context_and_says_how_long_it_is():
    msgs = chat(10)
    with pytest.raises(ContextOverflow) as caught:
        fit_messages(msgs, words, context_len=100, room=20, policy=STOP_AT_CONTEXT)
    assert caught.value.droppable and caught.value.prompt_tokens == words(msgs)
    assert f"the chat is {words(msgs):,} tokens" in str(caught.value)
    # the same chat fits whole under a larger context: nothing is refused
    assert fit_messages(msgs, words, 1000, 20, STOP_AT_CONTEXT).dropped == 0


def test_the_reply_keeps_its_max_tokens_but_at_most_a_quarter_of_the_context():
    assert reply_room(512, 8192) == 512
    assert reply_room(8000, 8192) == 2048
    assert reply_room(100, 100) == 25


# ---- with the demo model's tokenizer and a stored chat

needs_demo = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)


@pytest.fixture(scope="module")
def demo_source():
    """The app's LocalEngine over the demo model's tokenizer (no engine: only counting)."""
    client = SimpleNamespace(
        tokenizer_path=str(demo_model_dir()), max_context_len=8192, model_name="demo"
    )
    return LocalEngine(client)


@pytest.fixture
def store(tmp_path):
    with ConversationStore(tmp_path / "chats.sqlite3") as s:
        yield s


def long_chat(store: ConversationStore, settings: ChatSettings) -> int:
    """Two questions of ~20,000 characters with their replies, then a short question: past the
    demo model's 8,192 tokens, as in issue 45."""
    conv = store.create("long", settings=settings)
    for i in range(2):
        store.append(conv.id, "user", f"Part {i}: " + "the quick brown fox jumps. " * 770)
        store.append(conv.id, "assistant", f"Noted part {i}.")
    store.append(conv.id, "user", "What is the capital of France?")
    return conv.id


@needs_demo
def test_a_chat_past_the_context_drops_its_oldest_turns_and_the_view_marks_them(store, demo_source):
    conv_id = long_chat(store, ChatSettings(system_prompt="Answer briefly."))
    conv = store.get(conv_id)
    request = reply_request(conv, conv.messages, demo_source, continuing=False)
    whole = demo_source.count_prompt_tokens(request.messages, None)
    assert whole > 8192
    fitted, read_from = fitted_request(conv, conv.messages, request, demo_source, DROP_OLDEST)
    sent = fitted.messages
    assert sent[0] == {"role": "system", "content": "Answer briefly."}
    assert sent[-1]["content"] == "What is the capital of France?"
    assert [m["content"] for m in sent[1:]] == [
        m.content for m in conv.messages if m.id >= read_from
    ]
    assert read_from == conv.messages[2].id  # the first long turn is dropped, the second kept
    assert demo_source.count_prompt_tokens(sent, None) <= 8192 - 512
    # the reply that read from there: the chat shows a line above the first message it read
    reply = store.append(conv_id, "assistant", "Paris.", stats={"read_from": read_from})
    shown = view_messages(store.get(conv_id))
    titles = [v.shown.get("metadata", {}).get("title") for v in shown]
    beyond = titles.index(BEYOND_CONTEXT_LINE)
    assert shown[beyond].source.id == conv.messages[1].id  # under the last message not read
    assert shown[beyond + 1].source.id == read_from
    assert reply.id == store.get(conv_id).messages[-1].id


@needs_demo
def test_the_stop_policy_sends_nothing_and_marks_the_question_for_one_click(store, demo_source):
    conv_id = long_chat(store, ChatSettings(context_policy=STOP_AT_CONTEXT))
    conv = store.get(conv_id)
    request = reply_request(conv, conv.messages, demo_source, continuing=False)
    with pytest.raises(ContextOverflow) as caught:
        fitted_request(conv, conv.messages, request, demo_source, STOP_AT_CONTEXT)
    assert caught.value.droppable
    assert caught.value.prompt_tokens == demo_source.count_prompt_tokens(request.messages, None)
    # the page marks the question (turns.ReplyTurns.fitted); the chat says what ↻ does
    question = conv.messages[-1]
    store.update_message(
        question.id,
        question.content,
        {"unanswered": True, "over_context": caught.value.prompt_tokens},
    )
    titles = [v.shown.get("metadata", {}).get("title") for v in view_messages(store.get(conv_id))]
    assert titles[-1] == OVER_CONTEXT_LINE


@needs_demo
def test_a_200_turn_chat_is_fitted_with_the_real_tokenizer(store, demo_source):
    conv = store.create("many turns", settings=ChatSettings(system_prompt="Be kind."))
    for i in range(200):
        store.append(conv.id, "user", f"Question {i}: " + "tell me more about it. " * 20)
        store.append(conv.id, "assistant", f"Answer {i}: " + "here is more about it. " * 20)
    store.append(conv.id, "user", "And the last one?")
    conv = store.get(conv.id)
    messages = engine_messages(conv, conv.settings)

    def count(msgs):
        return demo_source.count_prompt_tokens(msgs, None)

    counted = Counted(count)
    fit = fit_messages(messages, counted, 8192, 512, DROP_OLDEST)
    assert fit.messages == most_turns_that_fit(messages, count, 8192 - 512)
    assert counted.calls <= 2 * 9 + 1


def test_a_chat_the_stop_policy_refuses_gets_a_notice_and_no_reply(store):
    """ReplyManager says a ContextOverflow to the tab that asked, and starts nothing."""
    conv = store.create("x")

    def make_turn():
        raise ContextOverflow("the chat is 9,000 tokens, past what the model reads", 9000, True)

    async def run():
        manager = ReplyManager(store, generate=None)
        manager.submit(conv.id, "tab", make_turn)
        assert not manager.busy_conversations()
        return manager.take_notices("tab")

    notices = asyncio.run(run())
    assert notices == ["Not sent: the chat is 9,000 tokens, past what the model reads."]
    assert store.get(conv.id).messages == []


def test_the_policy_is_a_chat_setting_with_the_first_choice_as_default(store):
    assert ChatSettings().context_policy == DROP_OLDEST
    conv = store.create("s", settings=ChatSettings(context_policy=STOP_AT_CONTEXT))
    assert store.get(conv.id).settings.context_policy == STOP_AT_CONTEXT
    assert "context" in ChatSettings(context_policy="sometimes").problems()["context_policy"]
    # a chat stored before the setting existed reads the default
    old = {k: v for k, v in ChatSettings().to_dict().items() if k != "context_policy"}
    assert ChatSettings.from_dict(old) == replace(ChatSettings(), context_policy=DROP_OLDEST)


def tool_source_and_box():
    """The demo model's counting LocalEngine (its template knows no tools: the default tool
    prompt) and a ToolBox whose server "test" runs ``add``."""
    from minisgl_app.chat.mcp_tools import ToolInfo
    from minisgl_app.chat.tool_loop import ToolBox

    client = SimpleNamespace(
        tokenizer_path=str(demo_model_dir()),
        max_context_len=8192,
        model_name="demo",
        tool_format=None,
    )
    box = ToolBox()
    box.tools["test"] = [ToolInfo("test", "add", "Add two whole numbers.", {"type": "object"})]
    return LocalEngine(client), box


@needs_demo
def test_the_meter_of_a_chat_with_tools_counts_them_as_the_reply_offers_them(store):
    from minisgl_app.chat.reply_request import chat_tool_loop, meter_text, tool_loop_for

    source, box = tool_source_and_box()
    conv = store.create("tools", ChatSettings(tools=("test/add",)))
    store.append(conv.id, "user", "What is 2 + 40?")
    store.append(conv.id, "assistant", "42.")
    conv = store.get(conv.id)
    store.append(conv.id, "user", "And 1 + 1?")
    sent = store.get(conv.id)
    request = reply_request(sent, sent.messages, source, continuing=False)
    request, loop = tool_loop_for(sent, sent.messages, request, box, source)
    asked = loop.first_round(request)
    expected = source.count_prompt_tokens(asked.messages, asked.chat_template_kwargs)
    loop = chat_tool_loop(conv.settings, box, source)
    assert (
        meter_text(conv, conv.settings, "And 1 + 1?", source, loop)
        == f"{expected:,} / 8,192 tokens"
    )
    without = meter_text(conv, conv.settings, "And 1 + 1?", source)
    assert int(without.split(" /")[0].replace(",", "")) < expected, "the tool prompt counts"


@needs_demo
def test_a_chat_with_tools_drops_whole_turns_and_keeps_each_call_with_its_result(store):
    from minisgl_app.chat.reply_request import tool_loop_for
    from minisgl_app.chat.store import ToolCallRecord
    from minisgl_app.chat.tool_loop import spelled_out

    source, box = tool_source_and_box()
    conv_id = long_chat(store, ChatSettings(tools=("test/add",)))
    for reply in store.get(conv_id).messages[1:4:2]:  # each long turn's reply called add
        call = ToolCallRecord(f"call-{reply.id}", "test/add", '{"a": 1, "b": 1}', 0, "done", "2")
        store.update_message(reply.id, reply.content, tool_calls=(call,))
    conv = store.get(conv_id)
    request = reply_request(conv, conv.messages, source, continuing=False)
    request, loop = tool_loop_for(conv, conv.messages, request, box, source)
    whole = loop.first_round(request)
    assert source.count_prompt_tokens(whole.messages, whole.chat_template_kwargs) > 8192
    fitted, read_from = fitted_request(conv, conv.messages, request, source, DROP_OLDEST, loop)
    assert read_from == conv.messages[2].id  # the first turn dropped whole, its call with it
    spelled = spelled_out(fitted.messages)
    roles = [m["role"] for m in spelled]
    assert roles == ["user", "assistant", "tool", "assistant", "user"], roles
    assert spelled[1]["tool_calls"][0]["id"] == spelled[2]["tool_call_id"]
    assert spelled[2]["tool_call_id"] == f"call-{conv.messages[3].id}"
    asked = loop.first_round(fitted)  # the default tool prompt: tools in a system turn
    assert "add" in asked.messages[0]["content"], "the tool prompt is read (and counted)"
    assert source.count_prompt_tokens(asked.messages, asked.chat_template_kwargs) <= 8192 - 512


@needs_demo
def test_the_meter_counts_what_sending_reads_after_a_question_stopped_before_its_first_word(
    store, demo_source
):
    """A question stopped before its first word, its reply empty, is left out of the prompt once
    the chat goes on (view.seen_messages); the meter counted it with the message being typed, and
    said "oldest 2 left out" of a chat whose next prompt leaves out nothing for length."""
    from minisgl_app.chat.reply_request import meter_text

    conv = store.create("stopped", ChatSettings())
    store.append(conv.id, "user", "Part 0: " + "the quick brown fox jumps. " * 770)
    store.append(conv.id, "assistant", "Noted part 0.")
    store.append(conv.id, "user", "Part 1: " + "the quick brown fox jumps. " * 770)
    store.append(conv.id, "assistant", "")  # stopped before its first word, the chat's last turn
    conv = store.get(conv.id)
    typed = "What is the capital of France?"
    store.append(conv.id, "user", typed)
    sent = store.get(conv.id)
    request = reply_request(sent, sent.messages, demo_source, continuing=False)
    assert [m["content"][:6] for m in request.messages] == ["Part 0", "Noted ", "What i"]
    expected = demo_source.count_prompt_tokens(request.messages, None)
    assert meter_text(conv, conv.settings, typed, demo_source) == f"{expected:,} / 8,192 tokens"
