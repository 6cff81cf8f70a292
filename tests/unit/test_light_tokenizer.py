"""The light tokenizer (the ``tokenizers`` library and our chat-template rendering, what the
tokenizer and detokenizer workers run) gives the same token ids, chat prompts, text and token
pieces as transformers' own tokenizer of the same folder."""

from __future__ import annotations

import json
import shutil

import pytest

from minisgl_engine.weights.demo import demo_model_dir
from minisgl_engine.weights.gguf_convert import is_complete

pytestmark = pytest.mark.skipif(
    not is_complete(demo_model_dir()), reason="demo model not pulled: run `minisgl-chat pull`"
)

CHATS = {
    "one question": [{"role": "user", "content": "What is the capital of France?"}],
    "system and turns": [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me about KV caches."},
    ],
    "unicode": [
        {"role": "user", "content": "什么是 KV Cache？ Emoji 🚀🧪, déjà vu, naïve café\u200b."}
    ],
    "empty content": [{"role": "user", "content": ""}],
    "empty turns": [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "and now?"},
    ],
    "special tokens in text": [{"role": "user", "content": "a <|im_end|> b <|im_start|>c"}],
    "whitespace": [{"role": "user", "content": "  spaces   and\nnewlines\t tabs \n\n"}],
    "continued answer": [
        {"role": "user", "content": "Write a story."},
        {"role": "assistant", "content": "Once upon a time, "},
    ],
    "continued with a space": [
        {"role": "user", "content": "Count."},
        {"role": "assistant", "content": "one two "},
    ],
    "none values": [{"role": "user", "content": "hi", "name": None}],
}

TEXTS = [
    "hello",
    " leading space",
    "The quick brown fox jumps over the lazy dog near the river bank. 12345",
    "什么是 KV Cache？它是一种缓存。",
    "Emoji 🚀🧪 and accents: déjà vu, naïve café.",
    "  spaces   and\nnewlines\t tabs",
    "<|im_start|>user\nhi<|im_end|>",
    "",
]

# A Qwen3-style template: tools, reasoning, a namespace, loop controls and raise_exception.
RICH_TEMPLATE = """{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}# Tools\\n<tools>{%- for tool in tools %}\\n{{- tool | tojson }}{%- endfor %}\\n</tools><|im_end|>\\n{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}
{%- set ns = namespace(last_user=0) %}
{%- for message in messages %}{%- if message.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}{%- continue %}{%- endif %}
{%- if message.role not in ['system', 'user', 'assistant', 'tool'] %}{{- raise_exception('unknown role ' + message.role) }}{%- endif %}
{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}{%- if message.reasoning_content and loop.index0 > ns.last_user %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}{{- message.content or '' }}{%- for call in message.tool_calls or [] %}{{- '\\n<tool_call>\\n' + {'name': call.function.name, 'arguments': call.function.arguments} | tojson + '\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}
{{- '' if bos_token else '' }}"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, «now».",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

TOOL_CHAT = [
    {"role": "system", "content": "You can call tools."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C and sunny"},
]


def both(folder):
    """(transformers' tokenizer, ours) of ``folder``."""
    from transformers import AutoTokenizer

    from minisgl_engine.light_tokenizer import LightTokenizer

    return AutoTokenizer.from_pretrained(folder), LightTokenizer(folder)


def outcome(call):
    """What a call gives, or the kind of error it raises (both refuse the same chats)."""
    try:
        return call()
    except Exception:  # noqa: BLE001 (which exception differs; that both refuse is the point)
        return "refused"


@pytest.fixture(scope="module")
def demo_pair():
    return both(demo_model_dir())


def copy_tokenizer(
    tmp_path, template: str | None = None, config: dict | None = None, json_edit=None
):
    """The demo's tokenizer files in ``tmp_path``, with another template, config fields or
    tokenizer.json."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(demo_model_dir() / name, tmp_path / name)
    if template is not None:
        (tmp_path / "chat_template.jinja").write_text(template)
    if config:
        data = json.loads((tmp_path / "tokenizer_config.json").read_text())
        data.update(config)
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(data))
    if json_edit is not None:
        data = json.loads((tmp_path / "tokenizer.json").read_text())
        json_edit(data)
        (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize("chat", CHATS.values(), ids=CHATS.keys())
@pytest.mark.parametrize("continued", [False, True], ids=["new turn", "continue_final_message"])
def test_chat_prompt_ids_equal_transformers(demo_pair, chat, continued):
    from minisgl_engine.tokenizer import chat_prompt_ids

    ref, ours = demo_pair
    kwargs = {"continue_final_message": True} if continued else {}
    expected = outcome(lambda: chat_prompt_ids(ref, chat, kwargs))
    assert outcome(lambda: chat_prompt_ids(ours, chat, kwargs)) == expected
    prompt = dict(add_generation_prompt=not continued, continue_final_message=continued)
    assert outcome(lambda: ours.apply_chat_template(chat, tokenize=False, **prompt)) == outcome(
        lambda: ref.apply_chat_template(chat, tokenize=False, **prompt)
    )


@pytest.mark.parametrize("text", TEXTS)
def test_text_ids_and_decoded_text_equal_transformers(demo_pair, text):
    ref, ours = demo_pair
    ids = ref.encode(text)
    assert ours.encode(text) == ids
    with_specials = ids + [1, 2, 0]
    for skip in (True, False):
        assert ours.decode(with_specials, skip_special_tokens=skip) == ref.decode(
            with_specials, skip_special_tokens=skip
        )


def test_vocabulary_pieces_and_end_token_equal_transformers(demo_pair):
    ref, ours = demo_pair
    assert ours.get_vocab() == ref.get_vocab()
    assert ours.eos_token_id == ref.eos_token_id
    assert ours.chat_template == ref.chat_template
    for token_id in (0, 1, 2, 17, 300, 5000, 49151):
        assert ours.convert_ids_to_tokens(token_id) == ref.convert_ids_to_tokens(token_id)


def test_detokenized_stream_and_logprob_pieces_equal_transformers(demo_pair):
    """The detokenizer worker's output (incremental, UTF-8-safe text; each token's bytes for
    logprobs) is the same over either tokenizer."""
    from minisgl_engine.detokenize import DecodeState, TokenBytes

    ref, ours = demo_pair
    ids = ref.encode("什么是 KV Cache？🚀 Emoji and déjà vu.\n  Done<|im_end|> after")
    streamed = {}
    for name, tok in (("ref", ref), ("ours", ours)):
        state = DecodeState(stop=[], prompt_tokens=0)
        pieces = [state.push(tok, token) for token in ids] + [state.flush(tok)]
        streamed[name] = pieces
    assert streamed["ours"] == streamed["ref"]
    assert "".join(streamed["ours"]) == ref.decode(ids, skip_special_tokens=True)
    ref_bytes, our_bytes = TokenBytes(ref), TokenBytes(ours)
    assert our_bytes.byte_of_char is not None  # byte-level BPE: exact bytes per token
    for token in ids:
        assert our_bytes.get(token) == ref_bytes.get(token)


def test_a_rich_template_with_tools_reasoning_and_variables(tmp_path):
    """Tools, reasoning, template variables (``enable_thinking``), a namespace, loop controls,
    raise_exception and the special tokens all render as in transformers."""
    from minisgl_engine.tokenizer import chat_prompt_ids

    ref, ours = both(copy_tokenizer(tmp_path, RICH_TEMPLATE))
    cases = [
        (TOOL_CHAT, {"tools": [WEATHER_TOOL]}),
        (TOOL_CHAT, {}),
        (CHATS["system and turns"], {"enable_thinking": False}),
        ([{"role": "robot", "content": "beep"}], {}),  # the template raises
        (
            [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": "Sure: "}],
            {"continue_final_message": True},
        ),
    ]
    for chat, kwargs in cases:
        assert outcome(lambda: chat_prompt_ids(ours, chat, kwargs)) == outcome(
            lambda: chat_prompt_ids(ref, chat, kwargs)
        ), kwargs
    assert chat_prompt_ids(ours, TOOL_CHAT, {"tools": [WEATHER_TOOL]}) != chat_prompt_ids(
        ours, TOOL_CHAT, {}
    )


def test_a_template_brought_by_the_request_and_named_templates(tmp_path):
    from minisgl_engine.tokenizer import chat_prompt_ids

    chat = CHATS["system and turns"]
    own = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    request = {"chat_template": "{{ messages | length }} messages{{ eos_token }}"}
    (tmp_path / "one").mkdir()
    ref, ours = both(copy_tokenizer(tmp_path / "one", own))
    for kwargs in ({}, request):
        assert chat_prompt_ids(ours, chat, kwargs) == chat_prompt_ids(ref, chat, kwargs)
    # templates listed in the config by name (no chat_template.jinja): the default is used
    named = tmp_path / "named"
    named.mkdir()
    copy_tokenizer(
        named,
        config={
            "chat_template": [
                {"name": "default", "template": own},
                {"name": "tool_use", "template": "tools: {{ (tools or []) | length }}"},
            ]
        },
    )
    (named / "chat_template.jinja").unlink()
    ref, ours = both(named)
    assert ours.chat_template == ref.chat_template
    for kwargs in ({}, {"tools": [WEATHER_TOOL]}, {"chat_template": "tool_use"}):
        assert chat_prompt_ids(ours, chat, kwargs) == chat_prompt_ids(ref, chat, kwargs)


def test_a_post_processor_that_adds_a_start_token(tmp_path):
    """A Llama-3-style tokenizer.json adds its start token to every text, never to a chat
    prompt (the template writes it); transformers ignores the config's add_bos_token then."""

    def add_bos(data):
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"Sequence": {"id": "A", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {
                "<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}
            },
        }

    for add_bos_token in (True, False):
        folder = tmp_path / str(add_bos_token)
        folder.mkdir()
        copy_tokenizer(folder, config={"add_bos_token": add_bos_token}, json_edit=add_bos)
        ref, ours = both(folder)
        assert ours.encode("hello") == ref.encode("hello")
        assert ours.encode("hello")[0] == 1
        chat = CHATS["one question"]
        assert ours.apply_chat_template(chat, add_generation_prompt=True) == (
            ref.apply_chat_template(chat, add_generation_prompt=True, return_dict=False)
        )


def test_special_tokens_the_config_adds(tmp_path):
    """A named special token tokenizer.json lacks is added as transformers adds it (a new id,
    skipped when decoding with skip_special_tokens)."""
    folder = copy_tokenizer(
        tmp_path, config={"eos_token": "<|endofreply|>", "extra_special_tokens": ["<|tool|>"]}
    )
    ref, ours = both(folder)
    assert ours.get_vocab() == ref.get_vocab()
    assert ours.eos_token_id == ref.eos_token_id
    ids = ref.encode("x <|endofreply|> y <|tool|>")
    assert ours.encode("x <|endofreply|> y <|tool|>") == ids
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)


def test_which_folders_are_read_without_transformers(tmp_path):
    from minisgl_engine.light_tokenizer import LightTokenizer
    from minisgl_engine.tokenizer import load_text_tokenizer

    assert isinstance(load_text_tokenizer(demo_model_dir()), LightTokenizer)
    llama2 = copy_tokenizer(tmp_path, config={"tokenizer_class": "LlamaTokenizerFast"})
    assert not isinstance(load_text_tokenizer(llama2), LightTokenizer)  # transformers' pipeline
    (llama2 / "tokenizer.json").unlink()
    (llama2 / "tokenizer_config.json").unlink()
    assert load_text_tokenizer(llama2) is None  # only a template: no tokenizer


def test_a_template_that_loops_forever_is_stopped(demo_pair):
    from minisgl_engine.errors import RequestError
    from minisgl_engine.tokenizer import chat_prompt_ids

    _, ours = demo_pair
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(RequestError, match="longer than"):
        chat_prompt_ids(ours, CHATS["one question"], {"chat_template": endless}, time_limit=0.2)
