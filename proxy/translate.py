"""OpenAI request bodies to the wire's :class:`GenerationRequest`; refuses what cannot be honoured.

Constraints (``response_format``, ``structured_outputs`` and vLLM's older ``guided_*`` fields)
are compiled here with llguidance, without the model, so a bad one is a 400 before the request
reaches Triton. The tools' grammar is built and compiled only by the backend, in the model's own
call format; a refusal of it comes back before the first output, a 400 naming ``tools``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from llgtriton import messages as wire_messages
from llgtriton import wire
from llgtriton.guides import (
    ANY_JSON_OBJECT,
    COMPACT_JSON,
    JSON_OPTIONS,
    CompilerBusy,
    GuideError,
    check_grammar,
    grammar_for,
    with_json_options,
)
from llgtriton.tools import ToolMode, ToolRequest
from llgtriton.wire import GuideType
from proxy.errors import INVALID_CONSTRAINT, InvalidRequestError, ServiceUnavailableError
from proxy.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    GenerationRequestBase,
    NamedFunction,
    NamedToolChoice,
    StructuredOutputs,
    Tool,
)
from proxy.schemas import closed_objects
from proxy.tools import ToolPlan, plan_tools

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Constraint:
    guide_type: GuideType
    guide: str | None
    param: str  # the request field it came from, for error messages


@dataclass(frozen=True)
class Translation:
    generation: wire.GenerationRequest
    tools: ToolPlan | None = None
    constraint_field: str | None = None  # the request field the backend's grammar comes from

    def refusal(self, error: InvalidRequestError) -> InvalidRequestError:
        """``error``, when it is the backend's refusal of the request's grammar, naming the field it came from."""
        field = self.constraint_field
        if field is None or error.code != INVALID_CONSTRAINT or error.param is not None:
            return error
        return InvalidRequestError(f"invalid {field}: {error.message}", param=field, code=INVALID_CONSTRAINT)


def _refuse(feature: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{feature} is not supported by this server yet; the request was refused rather than served without it",
        param=param,
        code="unsupported_parameter",
    )


class _CompiledGuides:
    """Digests of the constraints that compiled, most recent last: a repeat is not compiled again.

    Failures are not kept (a refused guide is cheap to refuse again), and only digests are, so the
    cache's size does not grow with the guides'.
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._capacity = capacity
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, guide_type: GuideType, guide: str | None) -> None:
        """Raise :class:`GuideError` (or :class:`CompilerBusy`) unless the constraint compiles."""
        digest = hashlib.blake2b(f"{guide_type.value}\0{guide}".encode(errors="surrogatepass")).digest()
        with self._lock:
            if digest in self._digests:
                self._digests.move_to_end(digest)
                return
        check_grammar(grammar_for(guide_type, guide))
        with self._lock:
            self._digests[digest] = None
            while len(self._digests) > self._capacity:
                self._digests.popitem(last=False)


_compiled = _CompiledGuides()


def check_constraint(constraint: Constraint) -> None:
    try:
        _compiled.check(constraint.guide_type, constraint.guide)
    except GuideError as exc:
        raise InvalidRequestError(
            f"invalid {constraint.param}: {exc}", param=constraint.param, code=INVALID_CONSTRAINT
        ) from None
    except CompilerBusy as exc:
        raise ServiceUnavailableError(str(exc)) from None


def _json_guide(value: dict[str, Any] | str | bool) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _structured(outputs: StructuredOutputs, param: str, names: dict[str, str] | None = None) -> Constraint | None:
    """The one constraint in ``outputs`` (None when it only lays JSON out); ``names`` gives each key's
    request field (default ``param.key``)."""

    def name(key: str) -> str:
        return names[key] if names else f"{param}.{key}"

    given = {
        "json": outputs.json_,
        "regex": outputs.regex,
        "choice": outputs.choice,
        "grammar": outputs.grammar,
        "structural_tag": outputs.structural_tag,
    }
    chosen = [key for key, value in given.items() if value is not None]
    if not chosen and (outputs.whitespace_pattern is not None or outputs.disable_any_whitespace):
        return None
    if not chosen:
        raise InvalidRequestError(f"{param} needs one of {', '.join(given)}", param=param)
    if len(chosen) > 1:
        fields = [name(key) for key in chosen]
        raise InvalidRequestError(f"one constraint per request; got {' and '.join(fields)}", param=fields[1])
    key = chosen[0]
    if outputs.json_ is not None:
        return Constraint(GuideType.JSON_SCHEMA, _json_guide(outputs.json_), name("json"))
    if outputs.choice is not None:
        return Constraint(GuideType.CHOICE, json.dumps(outputs.choice), name("choice"))
    if outputs.regex is not None:
        return Constraint(GuideType.REGEX, outputs.regex, name("regex"))
    if outputs.structural_tag is not None:
        return Constraint(GuideType.STRUCTURAL_TAG, outputs.structural_tag, name("structural_tag"))
    assert key == "grammar"
    return Constraint(GuideType.LARK, outputs.grammar, name("grammar"))


# Larger requests translate on a thread even without a grammar: their messages, or a prompt's
# token ids (about 80 ns each to copy: 500,000 of them held the loop 28 ms), are copied.
_MESSAGES_ON_THE_LOOP = 32
_PROMPT_IDS_ON_THE_LOOP = 2048


def translates_quickly(request: GenerationRequestBase) -> bool:
    """Whether translating ``request`` compiles no grammar (no constraint in any spelling, no tools) and
    copies little: work for the event loop itself. The others translate on a thread, where a
    grammar's compile keeps the streams and ``/health`` going."""
    response_format = request.response_format
    if response_format is not None and response_format.type != "text":
        return False
    if request.structured_outputs is not None or request.guided_json is not None or request.guided_regex is not None:
        return False
    if request.guided_choice is not None or request.guided_grammar is not None:
        return False
    if isinstance(request, ChatCompletionRequest):
        return not request.tools and not request.functions and len(request.messages) <= _MESSAGES_ON_THE_LOOP
    if isinstance(request, CompletionRequest) and isinstance(request.prompt, list):
        first = request.prompt[0]
        return len(first if isinstance(first, list) else request.prompt) <= _PROMPT_IDS_ON_THE_LOOP
    return True


def _constraints(request: GenerationRequestBase) -> list[Constraint]:
    found = []
    response_format = request.response_format
    if response_format is not None and response_format.type == "json_object":
        found.append(Constraint(GuideType.JSON, None, "response_format"))
    elif response_format is not None and response_format.type == "json_schema":
        spec = response_format.json_schema
        if spec is None or spec.schema_ is None:
            raise InvalidRequestError("response_format json_schema needs json_schema.schema", param="response_format")
        # strict or not, the schema is enforced: a constraint is never weakened silently. Strict, as at
        # OpenAI, objects are closed.
        schema = closed_objects(spec.schema_) if spec.strict else spec.schema_
        found.append(Constraint(GuideType.JSON_SCHEMA, json.dumps(schema), "response_format"))
    elif response_format is not None and response_format.type == "structural_tag":
        tag = {"structures": response_format.structures, "triggers": response_format.triggers}
        found.append(Constraint(GuideType.STRUCTURAL_TAG, json.dumps(tag), "response_format"))
    structured = request.structured_outputs
    given = _structured(structured, "structured_outputs") if structured is not None else None
    if given is not None:
        found.append(given)
    legacy = StructuredOutputs.model_validate(
        {
            "json": request.guided_json,
            "regex": request.guided_regex,
            "choice": request.guided_choice,
            "grammar": request.guided_grammar,
        }
    )
    if any(value is not None for value in (legacy.json_, legacy.regex, legacy.choice, legacy.grammar)):
        legacy_names = {key: f"guided_{key}" for key in ("json", "regex", "choice", "grammar")}
        found += [c for c in [_structured(legacy, "guided_*", legacy_names)] if c is not None]
    options = _json_options(request)
    if options is not None:
        found = [_laid_out(c, options) for c in found]
    # The same constraint under two spellings is one (guidance sends guided_grammar and structured_outputs.grammar).
    return [
        c for i, c in enumerate(found) if all((c.guide_type, c.guide) != (d.guide_type, d.guide) for d in found[:i])
    ]


def _json_options(request: GenerationRequestBase) -> dict[str, Any] | None:
    """The request's own JSON layout, if it asks for one (vLLM's fields); None keeps the server's."""
    structured = request.structured_outputs
    pattern = request.guided_whitespace_pattern
    if structured is not None and structured.whitespace_pattern is not None:
        pattern = structured.whitespace_pattern
    if pattern is not None:
        return {**JSON_OPTIONS, "whitespace_pattern": pattern}
    if structured is not None and structured.disable_any_whitespace:
        return dict(COMPACT_JSON)
    return None


def _laid_out(constraint: Constraint, options: dict[str, Any]) -> Constraint:
    """A JSON constraint written with ``options``; others, and malformed schemas (refused later), as they are."""
    if constraint.guide_type not in _JSON_TYPES:
        return constraint
    try:
        schema = ANY_JSON_OBJECT if constraint.guide is None else json.loads(constraint.guide)
    except (ValueError, RecursionError):
        return constraint
    return Constraint(GuideType.JSON_SCHEMA, json.dumps(with_json_options(schema, options)), constraint.param)


_JSON_TYPES = (GuideType.JSON, GuideType.JSON_SCHEMA)


def _json_answer(found: list[Constraint]) -> str | None:
    """The JSON schema (text) of a request's one JSON answer format, or None."""
    if len(found) != 1 or found[0].guide_type not in _JSON_TYPES:
        return None
    check_constraint(found[0])  # the tools' grammar holds it: a bad one is refused as itself
    return found[0].guide or json.dumps(ANY_JSON_OBJECT)


def _only_one(fields: list[str]) -> None:
    if len(fields) > 1:
        raise InvalidRequestError(f"one constraint per request; got {' and '.join(fields)}", param=fields[1])


def _one_constraint(found: list[Constraint]) -> Constraint | None:
    _only_one([c.param for c in found])
    if found:
        check_constraint(found[0])
        return found[0]
    return None


def _log_unknown_fields(request: GenerationRequestBase) -> None:
    if request.model_extra:
        logger.info("ignoring unknown request fields: %s", ", ".join(sorted(request.model_extra)))


@dataclass(frozen=True)
class _Inputs:
    """What differs between the endpoints: the prompt (exactly one form of it), its length, the logprobs asked."""

    max_tokens: int | None
    logprobs: bool
    top_logprobs: int
    prompt: str | None = None
    messages: tuple[wire_messages.ChatMessage, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    prompt_logprobs: bool = False
    tools: ToolRequest | None = None
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def _generation(
    request: GenerationRequestBase, constraint: Constraint | None, inputs: _Inputs
) -> wire.GenerationRequest:
    _log_unknown_fields(request)
    if request.ignore_eos and (constraint is not None or inputs.tools is not None):
        raise InvalidRequestError(wire.IGNORE_EOS_WITH_CONSTRAINT, param="ignore_eos")
    if request.ignore_eos and inputs.max_tokens is None:
        raise InvalidRequestError(wire.IGNORE_EOS_WITHOUT_MAX_TOKENS, param="max_tokens")
    return wire.GenerationRequest(
        prompt=inputs.prompt,
        messages=inputs.messages,
        prompt_token_ids=inputs.prompt_token_ids,
        max_tokens=inputs.max_tokens,
        stream=request.stream,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=max(request.top_k, 0),
        seed=request.seed,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        stop=request.stop_strings(),
        guide_type=constraint.guide_type if constraint else None,
        guide=constraint.guide if constraint else None,
        logprobs=inputs.logprobs,
        top_logprobs=inputs.top_logprobs,
        prompt_logprobs=inputs.prompt_logprobs,
        logit_bias=tuple((int(token), bias) for token, bias in (request.logit_bias or {}).items()),
        tools=inputs.tools,
        chat_template_kwargs=inputs.template_kwargs,
        ignore_eos=request.ignore_eos,
        grammar_pressure=request.grammar_pressure,
    )


def _legacy_functions(request: ChatCompletionRequest) -> ChatCompletionRequest:
    """OpenAI's deprecated ``functions``/``function_call`` as the ``tools``/``tool_choice`` they became."""
    if request.functions is None:
        if request.function_call not in (None, "none", "auto"):
            raise InvalidRequestError("function_call needs functions", param="function_call")
        return request
    if request.tools is not None:
        raise InvalidRequestError("send tools or functions, not both", param="functions")
    choice: Any = request.function_call
    if isinstance(choice, NamedFunction):
        choice = NamedToolChoice(type="function", function=choice)
    tools = [Tool(type="function", function=function) for function in request.functions]
    return request.model_copy(update={"tools": tools, "tool_choice": choice, "parallel_tool_calls": False})


def _check_tool_results(messages: list[ChatMessage]) -> None:
    """A tool message answers a call made before it: an id no earlier call has is a 400 (clients that
    send calls without ids are taken at their word)."""
    called: set[str] = set()
    for index, message in enumerate(messages):
        if message.role == "assistant":
            called.update(call.id for call in message.past_calls() if call.id is not None)
        if message.role == "tool" and called and message.tool_call_id not in called:
            raise InvalidRequestError(
                f"tool message {index} answers call {message.tool_call_id!r}, which no earlier assistant message made",
                param=f"messages.{index}.tool_call_id",
            )


def chat_generation(request: ChatCompletionRequest) -> Translation:
    _check_tool_results(request.messages)
    legacy = request.functions is not None
    request = _legacy_functions(request)
    if request.top_logprobs and not request.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    found = _constraints(request)
    answer = _json_answer(found)
    plan = plan_tools(request.tools, request.tool_choice, request.parallel_tool_calls, answer)
    if plan is not None and legacy:
        plan = dataclasses.replace(plan, legacy_functions=True)
    if plan is not None:
        # A JSON answer format composes with tools (the backend's grammar holds it); any other
        # constraint does not. The calls' grammar is the backend's to build, in the model's own
        # format, and to refuse: its refusal names "tools" (Translation.refusal).
        _only_one([*(c.param for c in found if answer is None), "tools"])
        found = found if answer is not None and plan.mode is ToolMode.AUTO else []
    constraint = _one_constraint(found)
    # A legacy function result is what the chat templates call a tool message.
    messages = tuple(
        wire_messages.ChatMessage(
            role="tool" if m.role == "function" else m.role,
            content=m.text(),
            tool_calls=m.past_calls(),
            tool_call_id=m.tool_call_id,
        )
        for m in request.messages
    )
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    inputs = _Inputs(
        max_tokens,
        bool(request.logprobs),
        request.top_logprobs or 0,
        messages=messages,
        tools=None if plan is None else plan.request,
        template_kwargs=request.chat_template_kwargs or {},
    )
    field = "tools" if plan is not None else constraint.param if constraint is not None else None
    return Translation(_generation(request, constraint, inputs), plan, field)


def checked_chat_generation(request: ChatCompletionRequest) -> Translation:
    """:func:`chat_generation`, with each tool's parameters compiled as the JSON schema they are. For a
    background response, which has no first output to wait for: it is refused before it is queued.
    The calls' grammar around them stays the backend's to build."""
    translation = chat_generation(request)
    if translation.tools is not None:
        for function in translation.tools.request.functions:
            check_constraint(Constraint(GuideType.JSON_SCHEMA, json.dumps(function.parameters), "tools"))
    return translation


def completion_generation(request: CompletionRequest) -> Translation:
    if request.max_tokens == 0 and not request.echo:
        raise InvalidRequestError("max_tokens 0 generates nothing; send echo to score the prompt", param="max_tokens")
    if request.suffix:
        raise _refuse("suffix", "suffix")
    if request.best_of not in (None, 1):
        raise _refuse("best_of", "best_of")
    constraint = _one_constraint(_constraints(request))
    inputs = _Inputs(
        request.max_tokens,
        request.logprobs is not None,
        request.logprobs or 0,
        prompt=request.prompt_text(),
        prompt_token_ids=request.prompt_token_ids(),
        # the prompt's own logprobs; with max_tokens 0 they are what the engine is asked for, and an
        # echoed prompt of token ids is written back from them
        prompt_logprobs=bool(request.echo)
        and (request.logprobs is not None or request.max_tokens == 0 or request.prompt_text() is None),
    )
    field = constraint.param if constraint is not None else None
    return Translation(_generation(request, constraint, inputs), constraint_field=field)
