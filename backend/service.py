"""The backend's front door: validates a :class:`GenerationRequest`, tokenizes it, schedules it."""

from __future__ import annotations

import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import torch
from transformers import PreTrainedModel

from backend.chat_template import ChatTemplate
from backend.constraints import GrammarCache, GuidanceLogitsProcessor
from backend.engine import Engine
from backend.errors import BackendError, InvalidRequest, Unavailable
from backend.masking import bitmask_applier
from backend.model_loader import load_model
from backend.output_stream import deliver_failure
from backend.requests import EngineRequest, ResponseSink, SamplingParams
from backend.response_pump import ResponsePump
from backend.scheduler import Scheduler
from backend.slot_engine import SlotEngine, cache_bytes, supports
from backend.synthetic import SyntheticService
from backend.telemetry import StepCounters
from backend.torch_engine import TorchEngine
from llgtriton.guides import GuideError, grammar_for
from llgtriton.settings import EngineSettings
from llgtriton.wire import LOGIT_BIAS_BOUND, MAX_PENALTY, MAX_TEMPERATURE, MAX_TOP_LOGPROBS, GenerationRequest

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


def longest_token_bytes(tokenizer: Any) -> int:
    """Bytes of the vocabulary's longest token as spelled (at least as many as it decodes to)."""
    return max((len(token.encode(errors="surrogatepass")) for token in tokenizer.get_vocab()), default=1)


class Runner(Protocol):
    """What runs prepared requests: the torch step loop (:class:`Scheduler`) or a TensorRT-LLM adapter."""

    counters: StepCounters

    @property
    def load(self) -> tuple[int, int]: ...

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None: ...

    def shutdown(self) -> None: ...


class GenerationService:
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

    @classmethod
    def start(cls, settings: EngineSettings) -> GenerationService:
        loaded = load_model(settings)
        chat_template = ChatTemplate(loaded.tokenizer, settings.chat_template)
        engine = torch_engine(settings, loaded.model, loaded.max_model_len)
        processor = GuidanceLogitsProcessor.for_tokenizer(
            loaded.tokenizer,
            engine.vocab_size,
            loaded.eos_token_ids,
            settings.max_batch_size,
            applier=bitmask_applier(torch.device(settings.device), engine.vocab_size, settings.max_batch_size),
        )
        scheduler = Scheduler(
            engine,
            loaded.tokenizer,
            loaded.eos_token_ids,
            max_batch_size=settings.max_batch_size,
            max_model_len=loaded.max_model_len,
            guidance=(processor, GrammarCache(processor.tokenizer)),
            max_queue_size=settings.max_queue_size,
            max_kv_tokens=settings.max_kv_tokens,
            token_bytes=lambda token: bytes(processor.tokenizer.decode_bytes([token])),
        )
        scheduler.start()
        logger.info(
            "ready: %s, context %d tokens, batch %d",
            loaded.path.name,
            loaded.max_model_len,
            settings.max_batch_size,
        )
        return cls(
            loaded.tokenizer,
            chat_template,
            scheduler,
            vocab_size=engine.vocab_size,
            max_model_len=loaded.max_model_len,
            pump=response_pump(settings),
            max_admitting=settings.max_queue_size,
        )

    @property
    def step_counters(self) -> StepCounters:
        return self._scheduler.counters

    def load(self) -> tuple[int, int]:
        """(running, waiting) request counts."""
        return self._scheduler.load

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
        texts = [m.content for m in request.messages] if request.messages is not None else [request.prompt or ""]
        size = sum(len(text.encode(errors="surrogatepass")) for text in texts)
        _check(
            size <= self._max_prompt_bytes,
            f"the prompt is {size} bytes, more than a context of {self.max_model_len} tokens can hold",
        )
        if request.messages is not None:
            ids = self._chat_template.render(request.messages)
        else:
            assert request.prompt is not None
            ids = list(self._tokenizer.encode(request.prompt))
        _check(len(ids) > 0, "the prompt is empty")
        return ids

    @staticmethod
    def grammar(request: GenerationRequest) -> str | None:
        """The request's constraint as an llguidance grammar (the scheduler compiles it, off this thread)."""
        if request.guide_type is None:
            return None
        try:
            return grammar_for(request.guide_type, request.guide)
        except GuideError as exc:
            raise InvalidRequest(str(exc)) from None

    def prepare(self, request: GenerationRequest, request_id: str) -> EngineRequest:
        grammar = self.grammar(request)
        sampling = sampling_params(request)
        ids = self.prompt_ids(request)
        room = self.max_model_len - len(ids)
        _check(room > 0, f"the prompt has {len(ids)} tokens; the context is {self.max_model_len} tokens")
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
        )

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
        if self._pump is None:
            self._scheduler.submit(prepared, sink)
            return
        pumped = self._pump.wrap(sink, request_id)
        try:
            self._scheduler.submit(prepared, pumped)
        except Exception:
            pumped.discard()
            raise

    def shutdown(self) -> None:
        self._admission.shutdown(wait=True, cancel_futures=False)
        self._scheduler.shutdown()
        if self._pump is not None:
            self._pump.close()


def torch_engine(settings: EngineSettings, model: PreTrainedModel, context: int) -> Engine:
    """The engine ``settings.kv_cache`` asks for; ``auto`` explains in the log why it chose what it did."""
    device = torch.device(settings.device)
    slots = settings.max_batch_size
    if settings.kv_cache == "slots":
        return _with_graphs(SlotEngine(model, device, slots=slots, context=context))
    if settings.kv_cache == "auto" and device.type == "cuda":
        reason = supports(model) or _slots_do_not_fit(model, device, slots, context)
        if reason is None:
            return _with_graphs(SlotEngine(model, device, slots=slots, context=context))
        logger.warning("KV cache: growing, not preallocated slots: %s", reason)
    return TorchEngine(model, device)


def _slots_do_not_fit(model: PreTrainedModel, device: torch.device, slots: int, context: int) -> str | None:
    """Why the slot cache would not fit in nine tenths of the free GPU memory, or None (logged) if it does.

    Only asked of a model the slot engine supports: ``cache_bytes`` reads Llama's config fields.
    """
    need = cache_bytes(model, slots, context)
    free = torch.cuda.mem_get_info(device)[0]
    if need > 0.9 * free:
        return (
            f"its {need / 2**30:.1f} GiB ({slots} slots x {context} tokens) exceed 90% of the "
            f"{free / 2**30:.1f} GiB free; lower --engine-max-batch-size or --engine-max-model-len"
        )
    logger.info("KV cache: %d slots x %d tokens (%.2f GiB), CUDA graphs", slots, context, need / 2**30)
    return None


def _with_graphs(engine: SlotEngine) -> SlotEngine:
    """Capture every decode shape before serving, so that no request's step waits for a capture."""
    started = time.perf_counter()
    captured = engine.capture_all()
    if captured:
        logger.info("captured %d decode graphs in %.1f s", captured, time.perf_counter() - started)
    return engine


def response_pump(settings: EngineSettings) -> ResponsePump | None:
    return ResponsePump() if settings.coalesce_responses else None


def start_service(settings: EngineSettings) -> GenerationService | SyntheticService:
    """The service for ``settings.engine``."""
    if settings.engine == "synthetic":
        return SyntheticService(settings)
    if settings.engine == "trtllm":
        from backend.trtllm.start import start_runner  # imports TensorRT-LLM

        model, runner = start_runner(settings)
        chat_template = ChatTemplate(model.tokenizer, settings.chat_template)
        service = GenerationService(
            model.tokenizer,
            chat_template,
            runner,
            vocab_size=model.vocab_size,
            max_model_len=model.max_model_len,
            pump=response_pump(settings),
            max_admitting=settings.max_queue_size,
        )
        logger.info("ready: %s on TensorRT-LLM (%s), context %d tokens", model.name, model.kind, model.max_model_len)
        return service
    return GenerationService.start(settings)
