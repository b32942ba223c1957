"""The backend's front door: validates a :class:`GenerationRequest`, tokenizes it, schedules it.

The parts are put together in :mod:`backend.assembly`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from backend.chat_template import ChatTemplate
from backend.contract import ResponseSink, deliver_failure
from backend.errors import BackendError, InvalidConstraint, InvalidRequest, Unavailable
from backend.requests import EngineRequest, SamplingParams
from backend.response_pump import ResponsePump
from backend.telemetry import StepCounters
from llgtriton.guides import GuideError
from llgtriton.messages import refused_template_variable
from llgtriton.reasoning import TAGS as REASONING_TAGS
from llgtriton.reasoning import ReasoningFormat, thinks
from llgtriton.request_grammar import request_grammar
from llgtriton.tool_formats import ToolCallFormat
from llgtriton.wire import (
    LOGIT_BIAS_BOUND,
    MAX_PENALTY,
    MAX_TEMPERATURE,
    MAX_TOP_LOGPROBS,
    GenerationOutput,
    GenerationRequest,
    GuideType,
)

logger = logging.getLogger(__name__)

ADMISSION_THREADS = 2  # prepare requests (tokenize, convert constraints) off Triton's execute()


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidRequest(message)


def sampling_params(request: GenerationRequest) -> SamplingParams:
    for name in ("temperature", "top_p", "presence_penalty", "frequency_penalty"):
        _check(math.isfinite(getattr(request, name)), f"{name} must be a finite number")
    _check(
        0.0 <= request.temperature <= MAX_TEMPERATURE,
        f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {request.temperature}",
    )
    _check(0.0 < request.top_p <= 1.0, f"top_p must be in (0, 1], got {request.top_p}")
    _check(request.top_k >= 0, f"top_k must be >= 0 (0 disables it), got {request.top_k}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        _check(
            -MAX_PENALTY <= value <= MAX_PENALTY, f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value}"
        )
    return SamplingParams(
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        seed=request.seed,
        logit_bias=request.logit_bias,
    )


class _NamingFormats:
    """A sink whose first response names the formats the calls and the thinking are written in."""

    def __init__(self, sink: ResponseSink, tool_call_format: str, reasoning_format: str) -> None:
        self._sink = sink
        self._formats: tuple[str, str] | None = (tool_call_format, reasoning_format)

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        if self._formats is not None:
            tool_call_format, reasoning_format = self._formats
            output = dataclasses.replace(output, tool_call_format=tool_call_format, reasoning_format=reasoning_format)
            self._formats = None
        self._sink.send(output, final=final)

    def fail(self, error: Exception) -> None:
        self._sink.fail(error)

    def is_cancelled(self) -> bool:
        return self._sink.is_cancelled()


def prompt_bytes(request: GenerationRequest) -> int:
    """Bytes of the text a request brings into its prompt: its messages, the calls in them, its tools.

    Counted before the chat template renders it: text that cannot fit is refused without the work.
    """
    if request.messages is None:
        return len((request.prompt or "").encode(errors="surrogatepass"))
    texts = [m.content for m in request.messages]
    texts += [call.name + call.arguments for m in request.messages for call in m.tool_calls]
    if request.tools is not None:
        texts.append(json.dumps(request.tools.openai_tools(), ensure_ascii=False))
    return sum(len(text.encode(errors="surrogatepass")) for text in texts)


def longest_token_bytes(tokenizer: Any) -> int:
    """Bytes of the vocabulary's longest token as spelled (at least as many as it decodes to)."""
    return max((len(token.encode(errors="surrogatepass")) for token in tokenizer.get_vocab()), default=1)


class Runner(Protocol):
    """What runs prepared requests: the torch step loop (:class:`Scheduler`) or a TensorRT-LLM adapter."""

    counters: StepCounters

    def load(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        ...

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None: ...

    def shutdown(self) -> None: ...


class GenerationService:
    """Validates a request, tokenizes it and hands it to its :class:`Runner`, off Triton's ``execute()``."""

    def __init__(
        self,
        tokenizer: Any,
        chat_template: ChatTemplate,
        runner: Runner,
        *,
        vocab_size: int,
        max_model_len: int,
        pump: ResponsePump | None = None,
        max_admitting: int = 256,
    ) -> None:
        self._pump = pump
        self._admission = ThreadPoolExecutor(max_workers=ADMISSION_THREADS, thread_name_prefix="llgtriton-admit")
        self._admitting = 0
        self._max_admitting = max_admitting
        self._admitting_lock = threading.Lock()
        self._vocab_size = vocab_size
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._chat_template = chat_template
        self._scheduler = runner
        # No prompt of more bytes than this fits the context, so a longer one is refused untokenized.
        self._max_prompt_bytes = max_model_len * longest_token_bytes(tokenizer)

    @property
    def step_counters(self) -> StepCounters:
        return self._scheduler.counters

    @property
    def reports_engine(self) -> bool:
        return True

    def load(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        return self._scheduler.load()

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            _check(len(ids) > 0, "the prompt is empty")
            vocabulary = self._vocab_size
            _check(max(ids) < vocabulary, f"the prompt holds token {max(ids)}; the vocabulary has {vocabulary}")
            return ids
        if request.messages is not None:
            json_answer = request.guide_type in (GuideType.JSON, GuideType.JSON_SCHEMA)
            ids = self._chat_template.render(
                request.messages, request.tools, json_answer=json_answer, template_kwargs=request.chat_template_kwargs
            )
        else:
            assert request.prompt is not None
            ids = list(self._tokenizer.encode(request.prompt))
        _check(len(ids) > 0, "the prompt is empty")
        return ids

    @property
    def tool_format(self) -> ToolCallFormat:
        return self._chat_template.tool_format

    def grammar(self, request: GenerationRequest) -> str | None:
        """The request's constraint as an llguidance grammar, tools in the model's own call syntax
        (the scheduler compiles it, off this thread)."""
        if request.tools is None and request.guide_type is None:
            return None
        try:
            reasoning = self.reasoning(request)
            return request_grammar(request, self.tool_format, self._chat_template.special_tokens, reasoning)
        except GuideError as exc:
            raise InvalidConstraint(str(exc)) from None
        except ValueError as exc:  # tools beside a constraint that is no JSON answer format
            raise InvalidRequest(str(exc)) from None

    def reasoning(self, request: GenerationRequest) -> ReasoningFormat | None:
        """How the output of ``request`` marks its thinking; None when it does not think (a prompt
        that is no conversation goes through no template, and so starts no thinking)."""
        if request.messages is None:
            return None
        form = self._chat_template.reasoning
        return form if thinks(form, request.chat_template_kwargs) else None

    def _check_fits(self, request: GenerationRequest) -> None:
        """Refuse, before any work on it, a prompt whose text cannot fit the context."""
        if request.messages is not None:
            _check(
                len(request.messages) <= self.max_model_len,
                f"{len(request.messages)} messages are more than a context of {self.max_model_len} tokens can hold",
            )
        size = prompt_bytes(request)
        _check(
            size <= self._max_prompt_bytes,
            f"the prompt is {size} bytes, more than a context of {self.max_model_len} tokens can hold",
        )

    def prepare(self, request: GenerationRequest, request_id: str) -> EngineRequest:
        self._check_fits(request)
        refused = refused_template_variable(request.chat_template_kwargs)
        _check(refused is None, refused or "")
        grammar = self.grammar(request)
        reasoning = self.reasoning(request)
        sampling = sampling_params(request)
        ids = self.prompt_ids(request)
        room = self.max_model_len - len(ids)
        scoring_only = request.prompt_logprobs and request.max_tokens == 0  # needs no room after the prompt
        _check(
            room > 0 or (scoring_only and room == 0),
            f"the prompt has {len(ids)} tokens; the context is {self.max_model_len} tokens",
        )
        max_tokens = room if request.max_tokens is None else request.max_tokens
        # 0 only scores the prompt (echo with logprobs)
        least = 0 if request.prompt_logprobs else 1
        _check(max_tokens >= least, f"max_tokens must be >= {least}, got {max_tokens}")
        _check(
            max_tokens <= room,
            f"the context is {self.max_model_len} tokens, but {len(ids) + max_tokens} were requested "
            f"({len(ids)} in the prompt, {max_tokens} to generate)",
        )
        _check(0 <= request.top_logprobs <= MAX_TOP_LOGPROBS, f"top_logprobs must be 0-{MAX_TOP_LOGPROBS}")
        _check(
            request.logprobs or request.prompt_logprobs or not request.top_logprobs,
            "top_logprobs needs logprobs or prompt logprobs",
        )
        for token, bias in request.logit_bias:
            _check(token < self._vocab_size, f"logit_bias names token {token}; the vocabulary has {self._vocab_size}")
            _check(
                abs(bias) <= LOGIT_BIAS_BOUND,
                f"a logit_bias value is -{LOGIT_BIAS_BOUND:g} to {LOGIT_BIAS_BOUND:g}, got {bias}",
            )
        return EngineRequest(
            request_id=request_id,
            prompt_ids=tuple(ids),
            max_tokens=max_tokens,
            sampling=sampling,
            stop=request.stop,
            stream=request.stream,
            grammar=grammar,
            logprobs=request.top_logprobs if request.logprobs else None,
            prompt_logprobs=request.top_logprobs if request.prompt_logprobs else None,
            kept_tokens=self._kept_tokens(request, reasoning),
            reasoning=reasoning,
            ignore_eos=request.ignore_eos,
            grammar_pressure=request.grammar_pressure,
        )

    def _kept_tokens(self, request: GenerationRequest, reasoning: ReasoningFormat | None) -> frozenset[int]:
        """The special tokens the proxy reads in ``request``'s text: its formats' tags (a tool-call
        ``marker`` is no syntax to read: it stays out)."""
        tags: list[str] = []
        if request.tools is not None:
            tags += [tag for tag in self.tool_format.tags if tag != self.tool_format.marker]
        if reasoning is not None:
            tags += REASONING_TAGS
        if not tags:
            return frozenset()
        special = self._chat_template.special_tokens
        return frozenset(special[tag] for tag in tags if tag in special)

    def submit(self, request: GenerationRequest, request_id: str, sink: ResponseSink) -> None:
        """Validate, tokenize and enqueue on an admission thread: Triton's ``execute()`` returns at once,
        whatever a request's prompt or constraint costs to prepare (a 2,000-rule GBNF grammar takes
        2 s to convert). A request that cannot be served fails its sink; raises :class:`Unavailable`
        when more requests are being admitted than the backend's queue holds.
        """
        with self._admitting_lock:
            if self._admitting >= self._max_admitting:
                raise Unavailable(f"{self._admitting} requests are being admitted already; try again later")
            self._admitting += 1
        try:
            self._admission.submit(self._admit, request, request_id, sink)
        except RuntimeError:  # shut down
            self._admitted()
            raise Unavailable("the backend is shutting down") from None

    def _admit(self, request: GenerationRequest, request_id: str, sink: ResponseSink) -> None:
        try:
            self.submit_now(request, request_id, sink)
        except BackendError as exc:
            logger.info("request %s refused: %s", request_id, exc)
            deliver_failure(sink, exc)
        except Exception as exc:  # a bug: this request fails, the service goes on
            logger.exception("admitting request %s failed", request_id)
            deliver_failure(sink, BackendError(f"admitting the request failed: {exc}"))
        finally:
            self._admitted()

    def _admitted(self) -> None:
        with self._admitting_lock:
            self._admitting -= 1

    def submit_now(self, request: GenerationRequest, request_id: str, sink: ResponseSink) -> None:
        """Validate and enqueue on this thread; raises a :class:`BackendError` for a request that cannot be served."""
        prepared = self.prepare(request, request_id)
        reasoning = prepared.reasoning
        if request.tools is not None or reasoning is not None:  # (outside the pump, which may merge responses)
            tool_format = self.tool_format.name if request.tools is not None else ""
            sink = _NamingFormats(sink, tool_format, reasoning.name if reasoning is not None else "")
        if self._pump is None:
            self._scheduler.submit(prepared, sink)
            return
        pumped = self._pump.wrap(sink, request_id)
        try:
            self._scheduler.submit(prepared, pumped)
        except Exception:
            pumped.discard()
            raise

    def health(self) -> None:
        """In this process, the engine's step loop never stops while the service runs."""

    def shutdown(self) -> None:
        self._admission.shutdown(wait=True, cancel_futures=False)
        self._scheduler.shutdown()
        if self._pump is not None:
            self._pump.close()
