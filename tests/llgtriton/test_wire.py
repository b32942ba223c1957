"""The Triton wire contract: request/response codecs and their agreement with config.pbtxt."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llgtriton import wire
from llgtriton.messages import ChatMessage
from tests.support.harness import ROOT

CONFIG_PBTXT = ROOT / "model_repository" / "llm" / "config.pbtxt"

# The numpy dtype each Triton type travels as (BYTES tensors are object arrays of bytes).
NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "STRING": np.object_,
    "INT32": np.int32,
    "UINT64": np.uint64,
    "FP32": np.float32,
    "BOOL": np.bool_,
}

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1

# Any unicode text that UTF-8 can carry (no lone surrogates): emoji, CJK, NUL, newlines ...
texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
float32s = st.floats(width=32, allow_nan=False)


@st.composite
def generation_requests(draw: st.DrawFn) -> wire.GenerationRequest:
    kind = draw(st.sampled_from(["chat", "text", "token ids"]))
    messages = None
    prompt = None
    token_ids = None
    if kind == "token ids":
        token_ids = tuple(draw(st.lists(st.integers(0, INT32_MAX), min_size=1, max_size=6)))
    elif kind == "chat":
        messages = tuple(
            draw(
                st.lists(
                    st.builds(ChatMessage, role=st.sampled_from(["system", "user", "assistant"]), content=texts),
                    min_size=1,
                    max_size=4,
                )
            )
        )
    else:
        prompt = draw(texts)
    return wire.GenerationRequest(
        prompt=prompt,
        messages=messages,
        prompt_token_ids=token_ids,
        max_tokens=(max_tokens := draw(st.none() | st.integers(1, INT32_MAX))),
        stream=draw(st.booleans()),
        temperature=draw(float32s),
        top_p=draw(float32s),
        top_k=draw(st.integers(0, INT32_MAX)),
        seed=draw(st.none() | st.integers(0, UINT64_MAX)),
        presence_penalty=draw(float32s),
        frequency_penalty=draw(float32s),
        stop=tuple(draw(st.lists(texts.filter(bool), max_size=5))),
        guide_type=draw(st.none() | st.sampled_from(list(wire.GuideType))),
        guide=(guide := draw(st.none() | texts)),
        logprobs=(logprobs := draw(st.booleans())),
        prompt_logprobs=(prompt_logprobs := draw(st.booleans())),
        top_logprobs=draw(st.integers(0, 20)) if logprobs or prompt_logprobs else 0,
        logit_bias=tuple(draw(st.dictionaries(st.integers(0, 2**40), st.floats(-100, 100), max_size=4)).items()),
        ignore_eos=draw(st.booleans()) if guide is None and max_tokens is not None else False,
    )


finite = st.floats(allow_nan=False, allow_infinity=False)
alternatives = st.builds(wire.Alternative, token=st.binary(max_size=6), logprob=finite)
token_logprobs = st.builds(
    wire.TokenLogprob,
    token=st.binary(max_size=6),  # any bytes: a token may hold part of a character
    logprob=finite,
    top=st.lists(alternatives, max_size=3).map(tuple),
)
generation_outputs = st.builds(
    wire.GenerationOutput,
    text=texts,
    finish_reason=st.none() | st.sampled_from(list(wire.FinishReason)),
    prompt_tokens=st.integers(0, INT32_MAX),
    completion_tokens=st.integers(0, INT32_MAX),
    reasoning=texts,
    logprobs=st.none() | st.lists(token_logprobs, max_size=3).map(tuple),
    prompt_logprobs=st.none()
    | st.builds(wire.PromptLogprobs, first=st.binary(max_size=6), rest=st.lists(token_logprobs, max_size=3).map(tuple)),
)


def _getter(tensors: Mapping[str, wire.Array]) -> wire.TensorGetter:
    return tensors.get


def _unbatched(tensors: dict[str, wire.Array]) -> dict[str, wire.Array]:
    """The same tensors without the leading batch dimension ([n] instead of [1, n])."""
    return {name: array[0] for name, array in tensors.items()}


def _bytes(*values: bytes) -> wire.Array:
    return np.array([list(values)], dtype=np.object_)


# Round trips --------------------------------------------------------------------------------


@settings(deadline=None)
@given(generation_requests())
def test_request_round_trips_through_the_wire(request: wire.GenerationRequest) -> None:
    assert wire.decode_request(_getter(wire.encode_request(request))) == request


@settings(deadline=None)
@given(generation_requests())
def test_request_decodes_from_unbatched_tensors_too(request: wire.GenerationRequest) -> None:
    assert wire.decode_request(_getter(_unbatched(wire.encode_request(request)))) == request


@settings(deadline=None)
@given(generation_requests())
def test_encoded_request_tensors_follow_the_declared_types_and_shapes(request: wire.GenerationRequest) -> None:
    tensors = wire.encode_request(request)
    assert set(tensors) <= set(wire.INPUT_TYPES)
    for name, array in tensors.items():
        assert array.dtype == NUMPY_DTYPES[wire.INPUT_TYPES[name]], name
        if name in wire.LIST_INPUTS:
            listed = request.stop if name == wire.STOP_WORDS else request.prompt_token_ids or ()
            assert array.shape == (1, len(listed)), name
        else:
            assert array.shape == (1, 1), name


@settings(deadline=None)
@given(generation_outputs)
def test_output_round_trips_through_the_wire(output: wire.GenerationOutput) -> None:
    tensors = wire.encode_output(output)
    assert ALWAYS_SENT <= set(tensors) <= set(wire.OUTPUT_TYPES)
    for name, array in tensors.items():
        assert array.dtype == NUMPY_DTYPES[wire.OUTPUT_TYPES[name]], name
        assert array.shape == (1, 1), name
    assert wire.decode_output(_getter(tensors)) == output
    assert wire.decode_output(_getter(_unbatched(tensors))) == output


ALWAYS_SENT = {wire.TEXT_OUTPUT, wire.FINISH_REASON, wire.NUM_INPUT_TOKENS, wire.NUM_OUTPUT_TOKENS}


def test_a_plain_token_response_carries_only_the_four_outputs_it_needs() -> None:
    output = wire.GenerationOutput(text=" hi", prompt_tokens=5, completion_tokens=1)
    tensors = wire.encode_output(output)
    assert set(tensors) == ALWAYS_SENT
    assert wire.decode_output(_getter(tensors)) == output


@pytest.mark.parametrize("payload", [b"[1]", b"{", b'{"a": 1}', b'{"1": "x"}', b'{"1": true}', b'{"-1": 2}'])
def test_malformed_logit_bias_is_refused(payload: bytes) -> None:
    tensors = {wire.TEXT_INPUT: _bytes(b"hi"), wire.LOGIT_BIAS: _bytes(payload)}
    with pytest.raises(wire.WireError, match="logit_bias"):
        wire.decode_request(_getter(tensors))


def test_seed_keeps_all_64_bits() -> None:
    request = wire.GenerationRequest(prompt="x", seed=UINT64_MAX)
    tensors = wire.encode_request(request)
    assert tensors[wire.RANDOM_SEED].dtype == np.uint64
    assert wire.decode_request(_getter(tensors)).seed == UINT64_MAX


def test_defaults_are_left_out_and_a_bare_text_input_decodes_to_the_defaults() -> None:
    tensors = wire.encode_request(wire.GenerationRequest(prompt="Hello"))
    left_out = (wire.CHAT_MESSAGES, wire.MAX_TOKENS, wire.RANDOM_SEED, wire.STOP_WORDS, wire.GUIDE_TYPE, wire.GUIDE)
    assert not set(left_out) & set(tensors)
    # A TensorRT-LLM style client that sends only text_input gets the documented defaults.
    decoded = wire.decode_request(_getter({wire.TEXT_INPUT: _bytes(b"Hello")}))
    assert decoded == wire.GenerationRequest(prompt="Hello")
    assert (decoded.temperature, decoded.top_p, decoded.top_k, decoded.max_tokens) == (1.0, 1.0, 0, None)


def test_text_output_with_several_elements_is_joined() -> None:
    tensors = wire.encode_output(wire.GenerationOutput(text="", finish_reason=wire.FinishReason.STOP))
    tensors[wire.TEXT_OUTPUT] = _bytes("héllo ".encode(), "wörld".encode())
    assert wire.decode_output(_getter(tensors)).text == "héllo wörld"


def test_empty_guide_type_means_no_guide_and_empty_stop_words_are_dropped() -> None:
    tensors = {
        wire.TEXT_INPUT: _bytes(b"x"),
        wire.GUIDE_TYPE: _bytes(b""),
        wire.STOP_WORDS: _bytes(b"", b"END", b""),
    }
    decoded = wire.decode_request(_getter(tensors))
    assert decoded.guide_type is None
    assert decoded.stop == ("END",)


def test_client_datatype_maps_string_to_bytes() -> None:
    assert wire.client_datatype("STRING") == "BYTES"
    for other in ("INT32", "UINT64", "FP32", "BOOL"):
        assert wire.client_datatype(other) == other


# Refusals -----------------------------------------------------------------------------------


def test_batch_of_two_is_refused() -> None:
    tensors = {wire.TEXT_INPUT: np.array([[b"a"], [b"b"]], dtype=np.object_)}
    with pytest.raises(wire.WireError, match="batch of 2"):
        wire.decode_request(_getter(tensors))


def test_three_dimensional_tensor_is_refused() -> None:
    tensors = {wire.TEXT_INPUT: np.array([[[b"a"]]], dtype=np.object_)}
    with pytest.raises(wire.WireError, match=r"shape \[1, n\] or \[n\]"):
        wire.decode_request(_getter(tensors))


def test_scalar_input_with_two_values_is_refused() -> None:
    tensors = {wire.TEXT_INPUT: _bytes(b"a"), wire.MAX_TOKENS: np.array([[1, 2]], dtype=np.int32)}
    with pytest.raises(wire.WireError, match="max_tokens"):
        wire.decode_request(_getter(tensors))


def test_request_without_prompt_or_messages_is_refused() -> None:
    with pytest.raises(wire.WireError, match="text_input") as caught:
        wire.decode_request(_getter({wire.MAX_TOKENS: np.array([[5]], dtype=np.int32)}))
    assert "chat_messages" in str(caught.value)


def test_request_with_both_prompt_and_messages_is_refused() -> None:
    tensors = {
        wire.TEXT_INPUT: _bytes(b"a"),
        wire.CHAT_MESSAGES: _bytes(json.dumps([{"role": "user", "content": "b"}]).encode()),
    }
    with pytest.raises(wire.WireError, match="exactly one"):
        wire.decode_request(_getter(tensors))


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"[{'role': 'user'}", "not JSON"),
        (b"[]", "non-empty JSON list"),
        (b'{"role": "user", "content": "hi"}', "non-empty JSON list"),
        (b'[{"content": "hi"}]', r"\[0\] needs a string 'role'"),
        (b'[{"role": "user", "content": "a"}, {"role": "user", "content": 5}]', r"\[1\]\.content must be a string"),
    ],
)
def test_malformed_chat_messages_are_refused(payload: bytes, match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.decode_request(_getter({wire.CHAT_MESSAGES: _bytes(payload)}))


def test_chat_message_with_null_content_decodes_as_empty_text() -> None:
    payload = json.dumps([{"role": "assistant", "content": None}, {"role": "user", "content": "go"}]).encode()
    decoded = wire.decode_request(_getter({wire.CHAT_MESSAGES: _bytes(payload)}))
    assert decoded.messages == (ChatMessage("assistant", ""), ChatMessage("user", "go"))


def test_unknown_guide_type_is_refused_naming_the_allowed_values() -> None:
    tensors = {wire.TEXT_INPUT: _bytes(b"x"), wire.GUIDE_TYPE: _bytes(b"xml_schema")}
    with pytest.raises(wire.WireError) as caught:
        wire.decode_request(_getter(tensors))
    message = str(caught.value)
    assert "xml_schema" in message
    for allowed in wire.GuideType:
        assert allowed.value in message


@pytest.mark.parametrize("name", [wire.TEXT_INPUT, wire.CHAT_MESSAGES, wire.STOP_WORDS, wire.GUIDE_TYPE, wire.GUIDE])
def test_invalid_utf8_is_refused(name: str) -> None:
    tensors = {wire.TEXT_INPUT: _bytes(b"ok"), name: _bytes(b"caf\xc3")}
    with pytest.raises(wire.WireError, match="not valid UTF-8") as caught:
        wire.decode_request(_getter(tensors))
    assert name in str(caught.value)


def test_invalid_utf8_in_text_output_is_refused() -> None:
    tensors = wire.encode_output(wire.GenerationOutput(text="x", finish_reason=wire.FinishReason.STOP))
    tensors[wire.TEXT_OUTPUT] = _bytes(b"\xff\xfe")
    with pytest.raises(wire.WireError, match="not valid UTF-8"):
        wire.decode_output(_getter(tensors))


def test_non_bytes_string_tensor_is_refused() -> None:
    tensors = {wire.TEXT_INPUT: np.array([[3]], dtype=np.int32)}
    with pytest.raises(wire.WireError, match="must be BYTES"):
        wire.decode_request(_getter(tensors))


# config.pbtxt agrees with the contract ------------------------------------------------------

_TENSOR = re.compile(r'\{\s*name:\s*"(?P<name>[^"]+)"\s+data_type:\s*TYPE_(?P<type>\w+)\s+dims:\s*\[(?P<dims>[^\]]*)\]')


def _section(text: str, keyword: str) -> list[tuple[str, str, list[int]]]:
    match = re.search(rf"^{keyword}\s*\[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"config.pbtxt has no {keyword} section"
    return [
        (m["name"], m["type"], [int(d) for d in m["dims"].replace(",", " ").split()])
        for m in _TENSOR.finditer(match.group(1))
    ]


def _config_text() -> str:
    # Comments may mention tensor names; drop them before matching.
    return "\n".join(line.split("#", 1)[0] for line in CONFIG_PBTXT.read_text().splitlines())


def test_config_pbtxt_inputs_match_the_wire_contract() -> None:
    inputs = _section(_config_text(), "input")
    assert len(inputs) == len({name for name, _, _ in inputs}), "duplicate input"
    assert {name: triton_type for name, triton_type, _ in inputs} == wire.INPUT_TYPES
    for name, _, dims in inputs:
        assert dims == ([-1] if name in wire.LIST_INPUTS else [1]), name


def test_config_pbtxt_outputs_match_the_wire_contract() -> None:
    outputs = _section(_config_text(), "output")
    assert len(outputs) == len({name for name, _, _ in outputs}), "duplicate output"
    assert {name: triton_type for name, triton_type, _ in outputs} == wire.OUTPUT_TYPES


def test_config_pbtxt_is_one_request_per_batch_and_decoupled() -> None:
    text = _config_text()
    assert re.findall(r"^\s*max_batch_size:\s*(\d+)", text, re.MULTILINE) == ["1"]
    assert re.search(r"model_transaction_policy\s*\{\s*decoupled:\s*true\s*\}", text)


@pytest.mark.parametrize("max_tokens", [2**31, 4_294_967_301, -(2**31) - 1])
def test_integers_outside_int32_are_refused_not_wrapped(max_tokens: int) -> None:
    with pytest.raises(wire.WireError, match="max_tokens"):
        wire.encode_request(wire.GenerationRequest(prompt="x", max_tokens=max_tokens))


def test_ignore_eos_with_a_constraint_is_refused_for_triton_clients_too() -> None:
    tensors = {
        wire.TEXT_INPUT: _bytes(b"hi"),
        wire.GUIDE_TYPE: _bytes(b"regex"),
        wire.GUIDE: _bytes(b"a+"),
        wire.IGNORE_EOS: np.array([[True]]),
    }
    with pytest.raises(wire.WireError, match="ignore_eos cannot be combined with a constraint"):
        wire.decode_request(_getter(tensors))


def test_ignore_eos_without_max_tokens_is_refused_for_triton_clients_too() -> None:
    tensors = {wire.TEXT_INPUT: _bytes(b"hi"), wire.IGNORE_EOS: np.array([[True]])}
    with pytest.raises(wire.WireError, match="ignore_eos needs max_tokens"):
        wire.decode_request(_getter(tensors))


def test_error_messages_on_the_wire_are_one_short_line_without_paths() -> None:
    state = "lexer error: too many expressions constructed\n<state>\nTokens: a‧b"
    assert (
        wire.error_message(wire.ErrorKind.INTERNAL, state) == "[internal] lexer error: too many expressions constructed"
    )
    where = wire.error_message(wire.ErrorKind.INVALID_ARGUMENT, "bad tokenizer(name_or_path='/srv/models/x/tok')")
    assert where == "[invalid_argument] bad tokenizer(name_or_path='<path>')"
    assert len(wire.error_message(wire.ErrorKind.INTERNAL, "x" * 5000)) < 520


def test_a_logit_bias_key_of_non_ascii_digits_is_refused() -> None:
    tensors = {wire.TEXT_INPUT: _bytes(b"hi"), wire.LOGIT_BIAS: _bytes('{"²": 1}'.encode())}
    with pytest.raises(wire.WireError, match="logit_bias"):
        wire.decode_request(_getter(tensors))


def test_every_input_tensor_is_documented_with_its_type() -> None:
    """docs/api.md lists Triton's inputs for clients that skip the proxy; a new field appears there too."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    undocumented = [name for name in wire.INPUT_TYPES if f"`{name}`" not in text]
    assert not undocumented
