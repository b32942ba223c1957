"""The Triton wire contract: tensor names, dtypes and codecs shared by the proxy and the backend.

Names follow the TensorRT-LLM backend's ensemble/BLS models (``text_input``, ``max_tokens``,
``stream``, ``text_output`` ...) so existing Triton clients and perf_analyzer input files keep
working. The model is configured with ``max_batch_size: 1`` and ``dims: [1]``, so every tensor
carries a leading batch dimension of 1 on the wire (``[1, 1]`` for a scalar).

Requests are encoded to / decoded from plain ``numpy`` arrays, so this module imports neither
``tritonclient`` nor ``triton_python_backend_utils`` nor torch: the proxy wraps the arrays in
``InferInput``s, ``model.py`` wraps them in ``pb_utils.Tensor``s.

A request field is declared once, as a row of :data:`REQUEST_FIELDS`: its tensor, its Triton type
and how its value crosses the wire. The encoder, the decoder and the input types (which
``config.pbtxt`` and ``docs/api.md`` are tested against) all read that table.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llgtriton.messages import ChatMessage, message_from_json, message_json
from llgtriton.tensor_values import (
    NUMPY_DTYPES,
    Array,
    TensorGetter,
    ValuesGetter,
    client_datatype,
    flat,
    scalar,
    single,
    text_of,
)
from llgtriton.token_logprobs import (
    Alternative,
    PromptLogprobs,
    TokenLogprob,
)
from llgtriton.tools import ToolRequest
from llgtriton.wire_errors import (
    INVALID_CONSTRAINT,
    MAX_ERROR_CHARS,
    ErrorKind,
    WireError,
    constraint_refusal,
    error_message,
    parse_error_message,
)
from llgtriton.wire_outputs import (
    FINISH_REASON,
    NUM_INPUT_TOKENS,
    NUM_OUTPUT_TOKENS,
    NUM_REASONING_TOKENS,
    OUTPUT_TYPES,
    PROMPT_LOGPROBS,
    REASONING_FORMAT,
    REASONING_OUTPUT,
    TEXT_OUTPUT,
    TOKEN_LOGPROBS,
    TOOL_CALL_FORMAT,
    FinishReason,
    GenerationOutput,
    GrammarPressure,
    decode_output,
    decode_output_values,
    encode_output,
)

# Names of the contract defined beside it (wire_errors, wire_outputs, tensor_values, token_logprobs),
# exported here too.
__all__ = [
    "FINISH_REASON",
    "INVALID_CONSTRAINT",
    "MAX_ERROR_CHARS",
    "NUM_INPUT_TOKENS",
    "NUM_OUTPUT_TOKENS",
    "NUM_REASONING_TOKENS",
    "OUTPUT_TYPES",
    "PROMPT_LOGPROBS",
    "REASONING_FORMAT",
    "REASONING_OUTPUT",
    "TEXT_OUTPUT",
    "TOKEN_LOGPROBS",
    "TOOL_CALL_FORMAT",
    "Alternative",
    "Array",
    "ErrorKind",
    "FinishReason",
    "GenerationOutput",
    "GrammarPressure",
    "PromptLogprobs",
    "TensorGetter",
    "TokenLogprob",
    "ValuesGetter",
    "WireError",
    "client_datatype",
    "constraint_refusal",
    "decode_output",
    "decode_output_values",
    "encode_output",
    "error_message",
    "parse_error_message",
]

# Inputs -------------------------------------------------------------------------------------
TEXT_INPUT = "text_input"
CHAT_MESSAGES = "chat_messages"
INPUT_IDS = "input_ids"  # a prompt given as token ids (TensorRT-LLM's name), instead of text
MAX_TOKENS = "max_tokens"
STREAM = "stream"
TEMPERATURE = "temperature"
TOP_P = "top_p"
TOP_K = "top_k"
RANDOM_SEED = "random_seed"
PRESENCE_PENALTY = "presence_penalty"
FREQUENCY_PENALTY = "frequency_penalty"
STOP_WORDS = "stop_words"
GUIDE_TYPE = "guided_decoding_guide_type"
GUIDE = "guided_decoding_guide"
RETURN_LOG_PROBS = "return_log_probs"  # TensorRT-LLM's name
TOP_LOGPROBS = "top_logprobs"
RETURN_PROMPT_LOG_PROBS = "return_prompt_log_probs"  # the prompt's own tokens' logprobs, for scoring
LOGIT_BIAS = "logit_bias"  # JSON object {"<token id>": bias}, as OpenAI's
TOOLS = "tools"  # JSON {functions, mode, parallel}: llgtriton.tools.ToolRequest
CHAT_TEMPLATE_KWARGS = "chat_template_kwargs"  # JSON object passed to the chat template (vLLM's name)
IGNORE_EOS = "ignore_eos"  # run to max_tokens past end tokens (vLLM's name; load generators send it)
REPORT_GRAMMAR_PRESSURE = "report_grammar_pressure"  # the final response carries grammar_pressure
# Alone, instead of a prompt: whether the engine can take requests now (the proxy's /ready asks).
HEALTH_CHECK = "health_check"

# Bounds both the proxy and the backend enforce (OpenAI's own).
MAX_TOP_LOGPROBS = 20
LOGIT_BIAS_BOUND = 100.0  # a bias is within [-LOGIT_BIAS_BOUND, LOGIT_BIAS_BOUND]
MAX_JSON_DEPTH = 128  # arrays and objects nested in a request body or a JSON tensor; deeper ones recurse
MAX_STOP_STRINGS = 16
MAX_LOGIT_BIAS_ENTRIES = 1024
MAX_TEMPERATURE = 2.0
MAX_PENALTY = 2.0  # presence and frequency penalties are within [-MAX_PENALTY, MAX_PENALTY]

# Headers (gRPC metadata) Triton's restricted APIs require: the admin APIs always, inference when
# the launcher is given triton.inference_key.
ADMIN_KEY_HEADER = "llgtriton-admin-key"
INFERENCE_KEY_HEADER = "llgtriton-key"
GRPC_KEY_PREFIX = "triton-grpc-protocol-"  # Triton's gRPC endpoint reads the key under this prefix

# A grammar decides where a constrained output ends; past that end nothing is allowed but the end token.
IGNORE_EOS_WITH_CONSTRAINT = (
    f"{IGNORE_EOS} cannot be combined with a constraint or tools: the constraint decides where the output ends"
)
# Without a bound, one request could hold its batch slots to the end of the context.
IGNORE_EOS_WITHOUT_MAX_TOKENS = f"{IGNORE_EOS} needs max_tokens: the output would run to the end of the context"


class GuideType(enum.StrEnum):
    """Values of ``guided_decoding_guide_type`` (TensorRT-LLM's names plus ``lark`` and ``choice``)."""

    JSON = "json"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF_GRAMMAR = "ebnf_grammar"
    LARK = "lark"
    CHOICE = "choice"
    STRUCTURAL_TAG = "structural_tag"  # {"structures": [{begin, schema, end}], "triggers": [...]}


@dataclass(frozen=True)
class GenerationRequest:
    """One generation as the backend sees it; exactly one of ``prompt`` / ``messages`` / ``prompt_token_ids``
    is set."""

    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    max_tokens: int | None = None
    stream: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    guide_type: GuideType | None = None
    guide: str | None = None
    logprobs: bool = False  # report each generated token's log probability
    top_logprobs: int = 0  # and this many most likely alternatives (needs logprobs or prompt_logprobs)
    prompt_logprobs: bool = False  # report the prompt tokens' log probabilities (max_tokens may then be 0)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    tools: ToolRequest | None = None  # functions the output may call, in the model's own format
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. {"enable_thinking": false}
    ignore_eos: bool = False  # end tokens do not end the output; max_tokens does (unconstrained only)
    grammar_pressure: bool = False  # report how hard the constraint pushed (GrammarPressure)

    def __post_init__(self) -> None:
        if [self.prompt, self.messages, self.prompt_token_ids].count(None) != 2:
            raise WireError(f"send exactly one of {TEXT_INPUT!r}, {CHAT_MESSAGES!r} and {INPUT_IDS!r}")
        if self.ignore_eos and (self.guide is not None or self.tools is not None):
            raise WireError(IGNORE_EOS_WITH_CONSTRAINT)
        if self.ignore_eos and self.max_tokens is None:
            raise WireError(IGNORE_EOS_WITHOUT_MAX_TOKENS)


def _json_value(payload: str, name: str) -> Any:
    try:
        return json.loads(payload)
    except (ValueError, RecursionError) as exc:  # not JSON, nested too deep, or an integer too long
        raise WireError(f"{name!r} is not JSON (or too deep to read): {str(exc)[:200] or type(exc).__name__}") from None


def _messages(payload: str) -> tuple[ChatMessage, ...]:
    raw = _json_value(payload, CHAT_MESSAGES)
    if not isinstance(raw, list) or not raw:
        raise WireError(f"{CHAT_MESSAGES!r} must be a non-empty JSON list of messages")
    try:
        return tuple(message_from_json(item, f"{CHAT_MESSAGES!r}[{index}]") for index, item in enumerate(raw))
    except ValueError as exc:
        raise WireError(str(exc)) from None


def _logit_bias(payload: str) -> tuple[tuple[int, float], ...]:
    raw = _json_value(payload, LOGIT_BIAS)
    if not isinstance(raw, dict):
        raise WireError(f"{LOGIT_BIAS!r} must be a JSON object of token id to bias")
    bias = []
    for key, value in raw.items():
        if not (key.isascii() and key.isdigit() and isinstance(value, int | float) and not isinstance(value, bool)):
            raise WireError(f"{LOGIT_BIAS!r} maps token ids (digits) to numbers; got {key!r}: {value!r}")
        bias.append((int(key), float(value)))
    return tuple(bias)


def _token_ids(values: list[object]) -> tuple[int, ...]:
    if not all(isinstance(value, int) and value >= 0 for value in values):
        raise WireError(f"{INPUT_IDS!r} holds token ids: integers from 0")
    return tuple(int(value) for value in values)  # type: ignore[call-overload]


# Request fields: one record per input tensor drives the encoder, the decoder and the types -----


def _guide_type(name: str) -> GuideType | None:
    if not name:
        return None
    try:
        return GuideType(name)
    except ValueError:
        allowed = ", ".join(t.value for t in GuideType)
        raise WireError(f"unknown {GUIDE_TYPE} {name!r}; use one of {allowed}") from None


def _tools(payload: str) -> ToolRequest | None:
    if not payload:
        return None
    try:
        return ToolRequest.from_json(payload)
    except ValueError as exc:
        raise WireError(f"{TOOLS!r}: {exc}") from None


def _template_kwargs(payload: str) -> dict[str, Any]:
    if not payload:
        return {}
    kwargs = _json_value(payload, CHAT_TEMPLATE_KWARGS)
    if not isinstance(kwargs, dict):
        raise WireError(f"{CHAT_TEMPLATE_KWARGS!r} must be a JSON object")
    return kwargs


def _always(value: Any, request: GenerationRequest) -> bool:
    return True


def _set(value: Any, request: GenerationRequest) -> bool:
    return value is not None


def _nonempty(value: Any, request: GenerationRequest) -> bool:
    return bool(value)


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class RequestField:
    """One input tensor and the :class:`GenerationRequest` attribute it carries.

    ``to_wire`` turns the attribute into the tensor's value (a list for a list input, dims ``[-1]``);
    ``from_wire`` turns the tensor's value back, STRING values already decoded to ``str``. An input
    that is absent keeps the attribute's default; ``sent`` says when the encoder leaves it out.
    """

    tensor: str
    triton_type: str
    attribute: str
    sent: Callable[[Any, GenerationRequest], bool] = _always
    to_wire: Callable[[Any], Any] = _same
    from_wire: Callable[[Any], Any] = _same
    is_list: bool = False


_NUMBER = {"INT32": int, "UINT64": int, "FP32": float, "BOOL": bool}


def _field(tensor: str, triton_type: str, attribute: str, **codec: Any) -> RequestField:
    """A field whose numbers and booleans read back as Python's (``from_wire`` defaults to that)."""
    codec.setdefault("from_wire", _NUMBER.get(triton_type, _same))
    return RequestField(tensor, triton_type, attribute, **codec)


REQUEST_FIELDS: tuple[RequestField, ...] = (
    _field(TEXT_INPUT, "STRING", "prompt", sent=_set),
    _field(
        CHAT_MESSAGES,
        "STRING",
        "messages",
        sent=_set,
        to_wire=lambda messages: json.dumps([message_json(m) for m in messages]),
        from_wire=_messages,
    ),
    _field(INPUT_IDS, "INT32", "prompt_token_ids", sent=_set, from_wire=_token_ids, is_list=True),
    _field(MAX_TOKENS, "INT32", "max_tokens", sent=_set),
    _field(STREAM, "BOOL", "stream"),
    _field(TEMPERATURE, "FP32", "temperature"),
    _field(TOP_P, "FP32", "top_p"),
    _field(TOP_K, "INT32", "top_k"),
    _field(RANDOM_SEED, "UINT64", "seed", sent=_set),
    _field(PRESENCE_PENALTY, "FP32", "presence_penalty"),
    _field(FREQUENCY_PENALTY, "FP32", "frequency_penalty"),
    _field(
        STOP_WORDS, "STRING", "stop", sent=_nonempty, from_wire=lambda words: tuple(w for w in words if w), is_list=True
    ),
    _field(GUIDE_TYPE, "STRING", "guide_type", sent=_set, to_wire=lambda kind: kind.value, from_wire=_guide_type),
    _field(GUIDE, "STRING", "guide", sent=_set),
    _field(RETURN_LOG_PROBS, "BOOL", "logprobs", sent=_nonempty),
    _field(TOP_LOGPROBS, "INT32", "top_logprobs", sent=lambda _, request: request.logprobs or request.prompt_logprobs),
    _field(RETURN_PROMPT_LOG_PROBS, "BOOL", "prompt_logprobs", sent=_nonempty),
    _field(
        LOGIT_BIAS,
        "STRING",
        "logit_bias",
        sent=_nonempty,
        to_wire=lambda bias: json.dumps({str(token): value for token, value in bias}),
        from_wire=_logit_bias,
    ),
    _field(TOOLS, "STRING", "tools", sent=_set, to_wire=lambda tools: tools.to_json(), from_wire=_tools),
    _field(
        CHAT_TEMPLATE_KWARGS,
        "STRING",
        "chat_template_kwargs",
        sent=_nonempty,
        to_wire=json.dumps,
        from_wire=_template_kwargs,
    ),
    _field(IGNORE_EOS, "BOOL", "ignore_eos", sent=_nonempty),
    _field(REPORT_GRAMMAR_PRESSURE, "BOOL", "grammar_pressure", sent=_nonempty),
)
# Triton data types of every input, as written in config.pbtxt (TYPE_<name>).
INPUT_TYPES: dict[str, str] = {spec.tensor: spec.triton_type for spec in REQUEST_FIELDS} | {HEALTH_CHECK: "BOOL"}
# Inputs whose dims are [-1] (a list per request); all others are [1].
LIST_INPUTS = frozenset(spec.tensor for spec in REQUEST_FIELDS if spec.is_list)


# Encoding -----------------------------------------------------------------------------------


def encode_health_check() -> dict[str, Array]:
    """The tensors of a health check: the engine answers with one empty final response, or an error."""
    return {HEALTH_CHECK: _scalar(HEALTH_CHECK, True)}


def _scalar(name: str, value: object) -> Array:
    return scalar(name, INPUT_TYPES[name], value)


def encode_request(request: GenerationRequest) -> dict[str, Array]:
    """The input tensors for ``request``; optional inputs at their default are left out."""
    tensors: dict[str, Array] = {}
    for spec in REQUEST_FIELDS:
        value = getattr(request, spec.attribute)
        if not spec.sent(value, request):
            continue
        wired = spec.to_wire(value)
        if spec.is_list:
            tensors[spec.tensor] = _list(spec, wired)
        else:
            tensors[spec.tensor] = _scalar(spec.tensor, wired)
    return tensors


def _list(spec: RequestField, values: Sequence[Any]) -> Array:
    if spec.triton_type == "STRING":
        return np.array([[value.encode("utf-8") for value in values]], dtype=np.object_)
    return np.array([list(values)], dtype=NUMPY_DTYPES[spec.triton_type])


# Decoding -----------------------------------------------------------------------------------


def decode_request(get: TensorGetter) -> GenerationRequest:
    """Build a :class:`GenerationRequest` from input tensors; ``get`` returns None for absent ones,
    which keep the request's defaults."""
    values = flat(get)
    fields: dict[str, Any] = {}
    for spec in REQUEST_FIELDS:
        found = _read(values, spec)
        if found is not None:
            fields[spec.attribute] = spec.from_wire(found)
    request = GenerationRequest(**fields)
    _check_bounds(request)
    return request


def _read(values: ValuesGetter, spec: RequestField) -> Any:
    """The input's value as ``from_wire`` takes it (a list for a list input, STRING as ``str``), or None."""
    found: Any = values(spec.tensor) if spec.is_list else single(values, spec.tensor)
    if found is None or spec.triton_type != "STRING":
        return found
    return [text_of(value, spec.tensor) for value in found] if spec.is_list else text_of(found, spec.tensor)


def _check_bounds(request: GenerationRequest) -> None:
    """Counts the proxy's request models bound, for clients that talk to Triton directly (the backend
    checks the values; these cost every step of the request, so they are bounded here)."""
    if len(request.stop) > MAX_STOP_STRINGS:
        raise WireError(f"at most {MAX_STOP_STRINGS} {STOP_WORDS}, got {len(request.stop)}")
    if len(request.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise WireError(f"at most {MAX_LOGIT_BIAS_ENTRIES} {LOGIT_BIAS} entries, got {len(request.logit_bias)}")
