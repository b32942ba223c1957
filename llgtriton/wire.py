"""The Triton wire contract: tensor names, dtypes and codecs shared by the proxy and the backend.

Names follow the TensorRT-LLM backend's ensemble/BLS models (``text_input``, ``max_tokens``,
``stream``, ``text_output`` ...) so existing Triton clients and perf_analyzer input files keep
working. The model is configured with ``max_batch_size: 1`` and ``dims: [1]``, so every tensor
carries a leading batch dimension of 1 on the wire (``[1, 1]`` for a scalar).

Requests are encoded to / decoded from plain ``numpy`` arrays, so this module imports neither
``tritonclient`` nor ``triton_python_backend_utils`` nor torch: the proxy wraps the arrays in
``InferInput``s, ``model.py`` wraps them in ``pb_utils.Tensor``s.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from llgtriton.messages import ChatMessage, message_from_json, message_json
from llgtriton.tools import ToolRequest

Array = npt.NDArray[np.generic]

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

# Outputs ------------------------------------------------------------------------------------
TEXT_OUTPUT = "text_output"
FINISH_REASON = "finish_reason"
NUM_INPUT_TOKENS = "num_input_tokens"
NUM_OUTPUT_TOKENS = "num_output_tokens"
NUM_REASONING_TOKENS = "num_reasoning_tokens"  # of the output tokens, those the model thought in
TOKEN_LOGPROBS = "token_logprobs"  # JSON list, one entry per token of this response (absent when not asked)
PROMPT_LOGPROBS = "prompt_logprobs"  # JSON object, on a request's first response (absent otherwise)
TOOL_CALL_FORMAT = "tool_call_format"  # the family calls are written in, on the first response of a request with tools
REASONING_FORMAT = "reasoning_format"  # how the output's thinking is marked, on the first response of one that thinks

# Triton data types of every tensor, as written in config.pbtxt (TYPE_<name>).
INPUT_TYPES: dict[str, str] = {
    TEXT_INPUT: "STRING",
    CHAT_MESSAGES: "STRING",
    INPUT_IDS: "INT32",
    MAX_TOKENS: "INT32",
    STREAM: "BOOL",
    TEMPERATURE: "FP32",
    TOP_P: "FP32",
    TOP_K: "INT32",
    RANDOM_SEED: "UINT64",
    PRESENCE_PENALTY: "FP32",
    FREQUENCY_PENALTY: "FP32",
    STOP_WORDS: "STRING",
    GUIDE_TYPE: "STRING",
    GUIDE: "STRING",
    RETURN_LOG_PROBS: "BOOL",
    TOP_LOGPROBS: "INT32",
    RETURN_PROMPT_LOG_PROBS: "BOOL",
    LOGIT_BIAS: "STRING",
    TOOLS: "STRING",
    CHAT_TEMPLATE_KWARGS: "STRING",
    IGNORE_EOS: "BOOL",
    HEALTH_CHECK: "BOOL",
}
OUTPUT_TYPES: dict[str, str] = {
    TEXT_OUTPUT: "STRING",
    FINISH_REASON: "STRING",
    NUM_INPUT_TOKENS: "INT32",
    NUM_OUTPUT_TOKENS: "INT32",
    NUM_REASONING_TOKENS: "INT32",
    TOKEN_LOGPROBS: "STRING",
    PROMPT_LOGPROBS: "STRING",
    TOOL_CALL_FORMAT: "STRING",
    REASONING_FORMAT: "STRING",
}
# Inputs whose dims are [-1] (a list per request); all others are [1].
LIST_INPUTS = frozenset({STOP_WORDS, INPUT_IDS})

_NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "STRING": np.object_,
    "INT32": np.int32,
    "UINT64": np.uint64,
    "FP32": np.float32,
    "BOOL": np.bool_,
}


# A grammar decides where a constrained output ends; past that end nothing is allowed but the end token.
IGNORE_EOS_WITH_CONSTRAINT = (
    f"{IGNORE_EOS} cannot be combined with a constraint or tools: the constraint decides where the output ends"
)
# Without a bound, one request could hold its batch slots to the end of the context.
IGNORE_EOS_WITHOUT_MAX_TOKENS = f"{IGNORE_EOS} needs max_tokens: the output would run to the end of the context"


def client_datatype(triton_type: str) -> str:
    """The datatype string tritonclient expects (``BYTES`` for config's ``STRING``)."""
    return "BYTES" if triton_type == "STRING" else triton_type


class WireError(ValueError):
    """A request or response tensor set that does not follow the contract."""


class ErrorKind(enum.StrEnum):
    """Why a request failed, carried at the start of the error message of its final response.

    Triton's streaming gRPC API reports a response's error as text only (``error_message``): the
    kind travels inside it, as ``[invalid_argument] prompt too long``. Ending the stream with a
    gRPC status instead (Triton's ``triton_grpc_error`` mode) crashes tritonserver 2.51 now and
    then ("HandleCancellation called even when the context was not cancelled", then SIGSEGV).
    """

    INVALID_ARGUMENT = "invalid_argument"
    UNSUPPORTED = "unsupported"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


MAX_ERROR_CHARS = 500
# An absolute path of two or more parts (a model folder, a cache file): the server's business, not a client's.
_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@+~-]+/)+[\w.@+~-]*")


def error_message(kind: ErrorKind, message: str) -> str:
    """The wire's error text: its kind, then the message's first line (llguidance appends its parser
    state, a panic its backtrace), paths left out, at most :data:`MAX_ERROR_CHARS` characters."""
    text = _PATH.sub("<path>", message.strip().split("\n", 1)[0])
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + " [...]"
    return f"[{kind.value}] {text}"


def parse_error_message(message: str) -> tuple[ErrorKind | None, str]:
    """The kind and the text of an error message; no kind when it did not come from our backend."""
    if message.startswith("["):
        head, separator, rest = message[1:].partition("] ")
        if separator and head in ErrorKind._value2member_map_:
            return ErrorKind(head), rest
    return None, message


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"


class GuideType(enum.StrEnum):
    """Values of ``guided_decoding_guide_type`` (TensorRT-LLM's names plus ``lark`` and ``choice``)."""

    JSON = "json"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    EBNF_GRAMMAR = "ebnf_grammar"
    LARK = "lark"
    CHOICE = "choice"


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

    def __post_init__(self) -> None:
        if [self.prompt, self.messages, self.prompt_token_ids].count(None) != 2:
            raise WireError(f"send exactly one of {TEXT_INPUT!r}, {CHAT_MESSAGES!r} and {INPUT_IDS!r}")
        if self.ignore_eos and (self.guide is not None or self.tools is not None):
            raise WireError(IGNORE_EOS_WITH_CONSTRAINT)
        if self.ignore_eos and self.max_tokens is None:
            raise WireError(IGNORE_EOS_WITHOUT_MAX_TOKENS)


@dataclass(frozen=True)
class Alternative:
    token: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's bytes and log probability, with the most likely alternatives."""

    token: bytes
    logprob: float
    top: tuple[Alternative, ...] = ()


@dataclass(frozen=True)
class PromptLogprobs:
    """The prompt's tokens, each scored given the tokens before it; nothing scores the first."""

    first: bytes
    rest: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class GenerationOutput:
    """One response of a generation: a text delta (streaming) or the whole text."""

    text: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The tokens this response covers, when the request asked for logprobs (None otherwise).
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: PromptLogprobs | None = None  # on the first response, when the request asked
    tool_call_format: str = ""  # on the first response of a request with tools (tool_formats.FORMATS)
    reasoning_format: str = ""  # on the first response of an output that thinks (reasoning.REASONING_FORMATS)
    reasoning_tokens: int = 0  # of completion_tokens, those of the thinking (a reasoning model's)


# Encoding -----------------------------------------------------------------------------------


def encode_health_check() -> dict[str, Array]:
    """The tensors of a health check: the engine answers with one empty final response, or an error."""
    return {HEALTH_CHECK: _scalar(HEALTH_CHECK, True)}


def _scalar(name: str, value: object) -> Array:
    triton_type = INPUT_TYPES.get(name) or OUTPUT_TYPES[name]
    dtype = _NUMPY_DTYPES[triton_type]
    if dtype is np.object_:
        assert isinstance(value, str)
        return np.array([[value.encode("utf-8")]], dtype=np.object_)
    if isinstance(value, int) and not isinstance(value, bool):
        limits = np.iinfo(dtype)  # type: ignore[type-var]
        if not limits.min <= value <= limits.max:
            raise WireError(f"{name!r} must be within [{limits.min}, {limits.max}], got {value}")
    return np.array([[value]], dtype=dtype)


def encode_request(request: GenerationRequest) -> dict[str, Array]:
    """The input tensors for ``request``; optional inputs at their default are left out."""
    tensors: dict[str, Array] = {}
    if request.prompt is not None:
        tensors[TEXT_INPUT] = _scalar(TEXT_INPUT, request.prompt)
    if request.messages is not None:
        payload = json.dumps([message_json(m) for m in request.messages])
        tensors[CHAT_MESSAGES] = _scalar(CHAT_MESSAGES, payload)
    if request.prompt_token_ids is not None:
        tensors[INPUT_IDS] = np.array([request.prompt_token_ids], dtype=np.int32)
    if request.max_tokens is not None:
        tensors[MAX_TOKENS] = _scalar(MAX_TOKENS, request.max_tokens)
    tensors[STREAM] = _scalar(STREAM, request.stream)
    tensors[TEMPERATURE] = _scalar(TEMPERATURE, request.temperature)
    tensors[TOP_P] = _scalar(TOP_P, request.top_p)
    tensors[TOP_K] = _scalar(TOP_K, request.top_k)
    if request.seed is not None:
        tensors[RANDOM_SEED] = _scalar(RANDOM_SEED, request.seed)
    tensors[PRESENCE_PENALTY] = _scalar(PRESENCE_PENALTY, request.presence_penalty)
    tensors[FREQUENCY_PENALTY] = _scalar(FREQUENCY_PENALTY, request.frequency_penalty)
    if request.stop:
        tensors[STOP_WORDS] = np.array([[s.encode("utf-8") for s in request.stop]], dtype=np.object_)
    if request.guide_type is not None:
        tensors[GUIDE_TYPE] = _scalar(GUIDE_TYPE, request.guide_type.value)
    if request.guide is not None:
        tensors[GUIDE] = _scalar(GUIDE, request.guide)
    if request.logprobs:
        tensors[RETURN_LOG_PROBS] = _scalar(RETURN_LOG_PROBS, True)
        tensors[TOP_LOGPROBS] = _scalar(TOP_LOGPROBS, request.top_logprobs)
    if request.prompt_logprobs:
        tensors[RETURN_PROMPT_LOG_PROBS] = _scalar(RETURN_PROMPT_LOG_PROBS, True)
        tensors[TOP_LOGPROBS] = _scalar(TOP_LOGPROBS, request.top_logprobs)
    if request.logit_bias:
        tensors[LOGIT_BIAS] = _scalar(LOGIT_BIAS, json.dumps({str(t): b for t, b in request.logit_bias}))
    if request.tools is not None:
        tensors[TOOLS] = _scalar(TOOLS, request.tools.to_json())
    if request.chat_template_kwargs:
        tensors[CHAT_TEMPLATE_KWARGS] = _scalar(CHAT_TEMPLATE_KWARGS, json.dumps(request.chat_template_kwargs))
    if request.ignore_eos:
        tensors[IGNORE_EOS] = _scalar(IGNORE_EOS, True)
    return tensors


def _entries(entries: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [
        {
            "token": list(e.token),
            "logprob": e.logprob,
            "top": [{"token": list(a.token), "logprob": a.logprob} for a in e.top],
        }
        for e in entries
    ]


def _logprobs_json(entries: tuple[TokenLogprob, ...] | None) -> str:
    return "" if entries is None else json.dumps(_entries(entries), separators=(",", ":"))


def _prompt_logprobs_json(prompt: PromptLogprobs | None) -> str:
    if prompt is None:
        return ""
    return json.dumps({"first": list(prompt.first), "rest": _entries(prompt.rest)}, separators=(",", ":"))


def _entries_from(items: Any) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(
            bytes(e["token"]),
            float(e["logprob"]),
            tuple(Alternative(bytes(a["token"]), float(a["logprob"])) for a in e["top"]),
        )
        for e in items
    )


def _logprobs_from_json(payload: str) -> tuple[TokenLogprob, ...] | None:
    if not payload:
        return None
    try:
        return _entries_from(json.loads(payload))
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"{TOKEN_LOGPROBS!r} is malformed: {exc}") from None


def _prompt_logprobs_from_json(payload: str) -> PromptLogprobs | None:
    if not payload:
        return None
    try:
        document = json.loads(payload)
        return PromptLogprobs(bytes(document["first"]), _entries_from(document["rest"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise WireError(f"{PROMPT_LOGPROBS!r} is malformed: {exc}") from None


def encode_output(output: GenerationOutput) -> dict[str, Array]:
    """A response's tensors: the text, finish reason and token counts always; the optional outputs only
    where they carry something (each tensor costs the python stub a shared-memory copy per response,
    and the decoder reads a missing one as its default)."""
    reason = output.finish_reason.value if output.finish_reason is not None else ""
    tensors = {
        TEXT_OUTPUT: np.array([[output.text.encode("utf-8")]], dtype=np.object_),
        FINISH_REASON: _scalar(FINISH_REASON, reason),
        NUM_INPUT_TOKENS: _scalar(NUM_INPUT_TOKENS, output.prompt_tokens),
        NUM_OUTPUT_TOKENS: _scalar(NUM_OUTPUT_TOKENS, output.completion_tokens),
    }
    if output.reasoning_tokens:
        tensors[NUM_REASONING_TOKENS] = _scalar(NUM_REASONING_TOKENS, output.reasoning_tokens)
    if output.logprobs is not None:
        tensors[TOKEN_LOGPROBS] = _scalar(TOKEN_LOGPROBS, _logprobs_json(output.logprobs))
    if output.prompt_logprobs is not None:
        tensors[PROMPT_LOGPROBS] = _scalar(PROMPT_LOGPROBS, _prompt_logprobs_json(output.prompt_logprobs))
    if output.tool_call_format:
        tensors[TOOL_CALL_FORMAT] = _scalar(TOOL_CALL_FORMAT, output.tool_call_format)
    if output.reasoning_format:
        tensors[REASONING_FORMAT] = _scalar(REASONING_FORMAT, output.reasoning_format)
    return tensors


# Decoding -----------------------------------------------------------------------------------

TensorGetter = Callable[[str], "Array | None"]
# The values of one response's tensor, already flat (see decode_output_values).
ValuesGetter = Callable[[str], "Sequence[object] | None"]


def _values(name: str, array: Array) -> list[object]:
    """The values of one request's tensor, accepting ``[1, n]`` (batched) and ``[n]`` shapes."""
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise WireError(f"{name!r} has a batch of {array.shape[0]}; send one request per prompt")
        array = array[0]
    if array.ndim != 1:
        raise WireError(f"{name!r} must have shape [1, n] or [n], got {list(array.shape)}")
    return list(array.tolist())


def _text(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"{name!r} is not valid UTF-8: {exc}") from None
    if isinstance(value, str):
        return value
    raise WireError(f"{name!r} must be BYTES, got {type(value).__name__}")


def _flat(get: TensorGetter) -> ValuesGetter:
    def values(name: str) -> list[object] | None:
        array = get(name)
        return None if array is None else _values(name, array)

    return values


def _single(values: ValuesGetter, name: str) -> object | None:
    found = values(name)
    if found is None:
        return None
    if len(found) != 1:
        raise WireError(f"{name!r} must hold one value, got {len(found)}")
    return found[0]


def _one(get: TensorGetter, name: str) -> object | None:
    return _single(_flat(get), name)


def _float(get: TensorGetter, name: str, default: float) -> float:
    value = _one(get, name)
    return default if value is None else float(value)  # type: ignore[arg-type]


def _int(get: TensorGetter, name: str) -> int | None:
    value = _one(get, name)
    return None if value is None else int(value)  # type: ignore[call-overload]


def _token_ids(get: TensorGetter) -> tuple[int, ...] | None:
    array = get(INPUT_IDS)
    if array is None:
        return None
    values = _values(INPUT_IDS, array)
    if not all(isinstance(value, int) and value >= 0 for value in values):
        raise WireError(f"{INPUT_IDS!r} holds token ids: integers from 0")
    return tuple(int(value) for value in values)  # type: ignore[call-overload]


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


def decode_request(get: TensorGetter) -> GenerationRequest:
    """Build a :class:`GenerationRequest` from input tensors; ``get`` returns None for absent ones."""
    prompt_value = _one(get, TEXT_INPUT)
    messages_value = _one(get, CHAT_MESSAGES)
    stop_array = get(STOP_WORDS)
    stop = () if stop_array is None else tuple(_text(v, STOP_WORDS) for v in _values(STOP_WORDS, stop_array))
    guide_type_value = _one(get, GUIDE_TYPE)
    guide_value = _one(get, GUIDE)
    guide_type: GuideType | None = None
    if guide_type_value is not None and _text(guide_type_value, GUIDE_TYPE):
        name = _text(guide_type_value, GUIDE_TYPE)
        try:
            guide_type = GuideType(name)
        except ValueError:
            allowed = ", ".join(t.value for t in GuideType)
            raise WireError(f"unknown {GUIDE_TYPE} {name!r}; use one of {allowed}") from None
    stream_value = _one(get, STREAM)
    logprobs_value = _one(get, RETURN_LOG_PROBS)
    prompt_logprobs_value = _one(get, RETURN_PROMPT_LOG_PROBS)
    bias_value = _one(get, LOGIT_BIAS)
    tools_value = _one(get, TOOLS)
    tools = None
    if tools_value is not None and _text(tools_value, TOOLS):
        try:
            tools = ToolRequest.from_json(_text(tools_value, TOOLS))
        except ValueError as exc:
            raise WireError(f"{TOOLS!r}: {exc}") from None
    ignore_eos_value = _one(get, IGNORE_EOS)
    kwargs_value = _one(get, CHAT_TEMPLATE_KWARGS)
    template_kwargs: Any = {}
    if kwargs_value is not None and _text(kwargs_value, CHAT_TEMPLATE_KWARGS):
        template_kwargs = _json_value(_text(kwargs_value, CHAT_TEMPLATE_KWARGS), CHAT_TEMPLATE_KWARGS)
        if not isinstance(template_kwargs, dict):
            raise WireError(f"{CHAT_TEMPLATE_KWARGS!r} must be a JSON object")
    request = GenerationRequest(
        prompt=None if prompt_value is None else _text(prompt_value, TEXT_INPUT),
        messages=None if messages_value is None else _messages(_text(messages_value, CHAT_MESSAGES)),
        prompt_token_ids=_token_ids(get),
        max_tokens=_int(get, MAX_TOKENS),
        stream=bool(stream_value) if stream_value is not None else False,
        temperature=_float(get, TEMPERATURE, 1.0),
        top_p=_float(get, TOP_P, 1.0),
        top_k=_int(get, TOP_K) or 0,
        seed=_int(get, RANDOM_SEED),
        presence_penalty=_float(get, PRESENCE_PENALTY, 0.0),
        frequency_penalty=_float(get, FREQUENCY_PENALTY, 0.0),
        stop=tuple(s for s in stop if s),
        guide_type=guide_type,
        guide=None if guide_value is None else _text(guide_value, GUIDE),
        logprobs=bool(logprobs_value) if logprobs_value is not None else False,
        top_logprobs=_int(get, TOP_LOGPROBS) or 0,
        prompt_logprobs=bool(prompt_logprobs_value) if prompt_logprobs_value is not None else False,
        logit_bias=() if bias_value is None else _logit_bias(_text(bias_value, LOGIT_BIAS)),
        tools=tools,
        chat_template_kwargs=template_kwargs,
        ignore_eos=bool(ignore_eos_value) if ignore_eos_value is not None else False,
    )
    _check_bounds(request)
    return request


def _check_bounds(request: GenerationRequest) -> None:
    """Counts the proxy's request models bound, for clients that talk to Triton directly (the backend
    checks the values; these cost every step of the request, so they are bounded here)."""
    if len(request.stop) > MAX_STOP_STRINGS:
        raise WireError(f"at most {MAX_STOP_STRINGS} {STOP_WORDS}, got {len(request.stop)}")
    if len(request.logit_bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise WireError(f"at most {MAX_LOGIT_BIAS_ENTRIES} {LOGIT_BIAS} entries, got {len(request.logit_bias)}")


def decode_output(get: TensorGetter) -> GenerationOutput:
    return decode_output_values(_flat(get))


def decode_output_values(values: ValuesGetter) -> GenerationOutput:
    """A response from the flat values of its tensors (BYTES as ``bytes``, INT32 as ``int``).

    The proxy reads them straight from the gRPC message, with no numpy arrays per streamed chunk.
    """
    text_values = values(TEXT_OUTPUT)
    text = "" if text_values is None else "".join(_text(v, TEXT_OUTPUT) for v in text_values)
    reason_value = _single(values, FINISH_REASON)
    reason = _text(reason_value, FINISH_REASON) if reason_value is not None else ""
    prompt_tokens, completion_tokens = _single(values, NUM_INPUT_TOKENS), _single(values, NUM_OUTPUT_TOKENS)
    return GenerationOutput(
        text=text,
        finish_reason=FinishReason(reason) if reason else None,
        prompt_tokens=int(prompt_tokens or 0),  # type: ignore[call-overload]
        completion_tokens=int(completion_tokens or 0),  # type: ignore[call-overload]
        reasoning_tokens=int(_single(values, NUM_REASONING_TOKENS) or 0),  # type: ignore[call-overload]
        logprobs=_logprobs_from_json(_text(_single(values, TOKEN_LOGPROBS) or b"", TOKEN_LOGPROBS)),
        prompt_logprobs=_prompt_logprobs_from_json(_text(_single(values, PROMPT_LOGPROBS) or b"", PROMPT_LOGPROBS)),
        tool_call_format=_text(_single(values, TOOL_CALL_FORMAT) or b"", TOOL_CALL_FORMAT),
        reasoning_format=_text(_single(values, REASONING_FORMAT) or b"", REASONING_FORMAT),
    )
