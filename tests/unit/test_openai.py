"""The OpenAI routes' pure logic: request decoding (hostile bodies included), the generate
request a generation sends, where stop strings cut, chat templates, and the [openai]
table through Triton's parameters."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from reposerve.config import parse_model_config
from reposerve.config.chat_templates import ChatTemplate, TemplateError, render_chat
from reposerve.config.triton_parameters import apply_triton_parameters, to_triton_parameters
from reposerve.openai.generation import Settings, StopScanner, choice_seed, generate_body
from reposerve.operations import OpenAIModel
from reposerve.protocol.openai import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    OpenAIRequestError,
    decode_request,
    message_text,
)
from tests.toy_models import TEXT_IN_OUT

pytestmark = pytest.mark.unit


def _model(**inputs: str) -> OpenAIModel:
    return OpenAIModel(
        name="m",
        kind="chat",
        input="text_input",
        output="text_output",
        inputs={"text_input": "BYTES", **inputs},
        outputs=["text_output"],
        max_tokens=16,
    )


SETTINGS = Settings(max_tokens=8, stop=["\n\n", "END"], stream=True, temperature=0.5, seed=3)


def test_a_vllm_style_model_gets_one_sampling_parameters_document():
    model = _model(
        stream="BOOL",
        sampling_parameters="BYTES",
        exclude_input_in_output="BOOL",
        return_num_output_tokens="BOOL",
    )
    body = msgspec.json.decode(generate_body(model, "hi", SETTINGS))
    assert body == {
        "text_input": "hi",
        "stream": True,
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
        "sampling_parameters": (
            '{"max_tokens":8,"temperature":0.5,"seed":3,"stop":["\\n\\n","END"]}'
        ),
    }


def test_a_trtllm_style_model_gets_each_setting_in_its_own_input():
    model = _model(max_tokens="INT32", random_seed="UINT64", stop_words="BYTES")
    body = msgspec.json.decode(generate_body(model, "hi", SETTINGS))
    assert body == {
        "text_input": "hi",
        "max_tokens": 8,
        "temperature": 0.5,  # no such input: a request parameter
        "random_seed": 3,
        "stop_words": ["\n\n", "END"],
    }


def test_a_choices_seed_wraps_into_the_apis_range_and_the_inputs_type():
    largest = (1 << 63) - 1
    assert [choice_seed(largest - 1, index) for index in range(3)] == [
        largest - 1,
        largest,
        -(1 << 63),
    ]
    for datatype, seed, sent in (("UINT64", -1, (1 << 64) - 1), ("INT32", 1 << 31, -(1 << 31))):
        model = _model(random_seed=datatype)
        settings = Settings(max_tokens=8, stop=[], stream=False, seed=seed)
        assert msgspec.json.decode(generate_body(model, "hi", settings))["random_seed"] == sent
    with pytest.raises(OpenAIRequestError) as caught:
        decode_request(
            b'{"model": "m", "prompt": "a", "seed": 9223372036854775808}', CompletionRequest
        )
    assert caught.value.param == "seed"


def test_a_model_that_cannot_take_the_stops_streams_so_they_cut_it_early():
    whole = msgspec.structs.replace(SETTINGS, stream=False)
    body = msgspec.json.decode(generate_body(_model(stream="BOOL"), "hi", whole))
    assert body["stream"] is True
    told = msgspec.json.decode(generate_body(_model(stream="BOOL", stop="BYTES"), "hi", whole))
    assert told["stream"] is False and told["stop"] == ["\n\n", "END"]


def test_a_model_with_none_of_them_gets_parameters_and_the_server_keeps_the_stops():
    body = msgspec.json.decode(generate_body(_model(), "hi", SETTINGS))
    assert body == {"text_input": "hi", "max_tokens": 8, "temperature": 0.5, "seed": 3}


@pytest.mark.parametrize(
    ("text", "stops", "sent", "held", "stopped"),
    [
        ("hello wor", ["world"], "hello ", "wor", False),  # "wor" may begin "world"
        ("hello world!", ["world"], "hello ", "", True),
        ("a\n", ["\n\n", "x"], "a", "\n", False),
        ("abc", ["zzz"], "abc", "", False),
        ("abab", ["abac"], "ab", "ab", False),  # the longest end that begins a stop
        ("END and \n\n", ["\n\n", "END"], "", "", True),  # the earliest stop wins
    ],
)
def test_where_stop_strings_cut_and_what_is_held_back(text, stops, sent, held, stopped):
    scanner = StopScanner(stops)
    assert scanner.feed(text) == sent
    assert (scanner.held, scanner.stopped) == (held, stopped)


@given(
    st.lists(st.text(alphabet="ab\n", max_size=6), max_size=8),
    st.lists(st.text(alphabet="ab\n", min_size=1, max_size=3), min_size=1, max_size=3),
)
def test_holding_back_never_lets_a_stop_through_split_anywhere(pieces, stops):
    """However the text is split: what is let out is the text up to a stop, which follows
    it at once, and holds none; with no stop in the text (and what was held let out at
    the end), it is all of it."""
    scanner = StopScanner(stops)
    sent = "".join(scanner.feed(piece) for piece in pieces)
    whole = "".join(pieces)
    if not scanner.stopped:
        sent += scanner.held
    assert whole.startswith(sent)
    assert not any(stop in sent for stop in stops)
    if scanner.stopped:
        assert any(whole[len(sent) :].startswith(stop) for stop in stops)
    else:
        assert sent == whole


def test_requests_ignore_unknown_fields_and_refuse_what_cannot_be_honoured():
    chat = decode_request(
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "store": true,'
        b' "max_completion_tokens": 5, "max_tokens": 9, "stop": "x"}',
        ChatRequest,
    )
    assert chat.token_limit == 5 and chat.stops == ["x"]
    cases = [
        (b'{"model": "m", "messages": []}', ChatRequest, "messages"),
        (b'{"messages": [{"role": "user"}]}', ChatRequest, "model"),
        (b'{"model": "m", "prompt": "x", "n": 17}', CompletionRequest, "n"),
        (b'{"model": "m", "prompt": [1, 2]}', CompletionRequest, "prompt[0]"),  # token ids
        (b'{"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', CompletionRequest,
         "stop"),
        (b'{"model": "m", "prompt": "x", "stop": [""]}', CompletionRequest, "stop"),
        (b'{"model": "m", "prompt": "x", "logprobs": 2}', CompletionRequest, "logprobs"),
        (b'{"model": "m", "prompt": "x", "suffix": "y"}', CompletionRequest, "suffix"),
        (b'{"model": "m", "input": []}', EmbeddingRequest, "input"),
        (b'{"model": "m", "input": ["a", ""]}', EmbeddingRequest, "input"),
        (b'{"model": "m", "input": "a", "dimensions": 8}', EmbeddingRequest, "dimensions"),
        (b'{"model": "m", "input": "a", "encoding_format": "hex"}', EmbeddingRequest,
         "encoding_format"),
        (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], '
         b'"response_format": {"type": "json_object"}}', ChatRequest, "response_format"),
    ]  # fmt: skip
    for body, kind, param in cases:
        with pytest.raises(OpenAIRequestError) as refused:
            decode_request(body, kind)
        assert refused.value.param == param, (body, refused.value.message)


@given(st.binary(max_size=200) | st.recursive(st.none() | st.integers() | st.text(), lambda c:
       st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4)).map(
       lambda v: msgspec.json.encode(v)))  # fmt: skip
def test_any_body_decodes_or_is_refused_naming_what_is_wrong(body):
    for kind in (ChatRequest, CompletionRequest, EmbeddingRequest):
        try:
            decode_request(body, kind)
        except OpenAIRequestError as refused:
            assert refused.message


def test_message_content_as_parts_and_refused_parts():
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]}]  # fmt: skip
    assert message_text(messages) == [{"role": "user", "content": "a\nb"}]
    for content in ([{"type": "image_url"}], [{"type": "text", "text": 3}], 5):
        with pytest.raises(OpenAIRequestError):
            message_text([{"role": "user", "content": content}])
    with pytest.raises(OpenAIRequestError):
        message_text([{"content": "no role"}])


def test_a_chat_template_renders_with_what_hugging_face_templates_expect():
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}{{ eos_token }}"
        "{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}"
        "{% if add_generation_prompt %}assistant:{% endif %}",
        bos_token="<s>",
        eos_token="</s>",
    )
    messages = [{"role": "user", "content": "héllo"}]
    assert render_chat(template, messages, None) == "<s>user: héllo</s>assistant:"
    with_tools = render_chat(template, messages, [{"name": "f"}])
    assert '[{"name": "f"}]' in with_tools
    refusing = ChatTemplate("{{ raise_exception('only user messages') }}")
    with pytest.raises(TemplateError, match="only user messages"):
        render_chat(refusing, messages, None)
    escaping = ChatTemplate("{{ messages.__class__.__mro__ }}")  # the sandbox holds
    with pytest.raises(TemplateError):
        render_chat(escaping, messages, None)


def test_the_openai_table_travels_through_tritons_parameters():
    config = parse_model_config(
        f'backend = "python"\n{TEXT_IN_OUT}'
        '[openai]\nkind = "chat"\nchat_template = "t.jinja"\nmax_tokens = 12\n',
        "m/config.toml",
    )
    parameters = to_triton_parameters(config)
    assert parameters["reposerve.openai.kind"] == {"string_value": "chat"}
    table = apply_triton_parameters({}, parameters, "m")
    assert table["openai"] == {"kind": "chat", "chat_template": "t.jinja", "max_tokens": 12}
