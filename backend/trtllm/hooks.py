"""The logits post-processors TensorRT-LLM calls: a request's logit bias, then its llguidance mask.

They never raise: TensorRT-LLM ends every request in the batch when a post-processor raises
(``terminateActiveRequests`` in the executor). On any failure the affected rows keep only their
end-of-sequence tokens, and the failure is recorded so the adapter ends that request with an error.

- :class:`RequestLogitsProcessor` has the LLM API's per-request signature
  (``tensorrt_llm.sampling_params.LogitsProcessor.__call__``). The PyTorch backend pickles it to
  its worker process (even on one GPU) and calls it with ``client_id=None`` and an internal
  ``req_id``, so it carries its own state: the grammar text and the tokenizer folder; the matcher
  is built where it runs, once per process and grammar.
- :class:`BatchedHook` has the executor's batched signature
  (``LogitsPostProcessorConfig(processor_batched=...)``) and runs in our process: it keys its
  state by ``client_id``, hands each row's new tokens to :class:`GuidanceLogitsProcessor` and lets
  it mask the rows.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import llguidance
import llguidance.numpy
import torch
from llguidance import LLMatcher, LLTokenizer

from backend.constraints import GuidanceLogitsProcessor
from backend.grammar_cache import GrammarCache
from backend.guidance_tokenizer import guidance_tokenizer
from backend.masking import allowed_tokens
from backend.sampling import apply_logit_bias

logger = logging.getLogger(__name__)


def keep_only(logits: torch.Tensor, tokens: Sequence[int]) -> None:
    """Every logit but those of ``tokens`` becomes -inf, in place (``logits`` is ``[..., V]``)."""
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[[token for token in tokens if token < logits.shape[-1]]] = True
    logits.masked_fill_(~keep, float("-inf"))


@contextmanager
def on_stream(logits: torch.Tensor, stream_ptr: int | None) -> Iterator[None]:
    """Run torch work on the engine's CUDA stream (the executor passes it; the PyTorch backend does not)."""
    context: Any = nullcontext()
    if stream_ptr and logits.is_cuda:
        stream = torch.cuda.ExternalStream(stream_ptr, device=logits.device)  # type: ignore[no-untyped-call]
        context = torch.cuda.stream(stream)
    with context:
        yield


@functools.lru_cache(maxsize=8)
def _tokenizer(tokenizer_dir: str, width: int, eos: tuple[int, ...]) -> LLTokenizer:
    from transformers import AutoTokenizer  # in the engine's process (TensorRT-LLM depends on transformers)

    hf_tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return guidance_tokenizer(hf_tokenizer, width, eos)


@functools.lru_cache(maxsize=8)
def _grammar_cache(tokenizer_dir: str, width: int, eos: tuple[int, ...]) -> GrammarCache:
    """Compiled grammars per process and tokenizer, so a repeated schema compiles once."""
    return GrammarCache(_tokenizer(tokenizer_dir, width, eos))


class RequestLogitsProcessor:
    """One request's bias and constraint for the LLM API; picklable, built lazily where it runs."""

    def __init__(
        self,
        *,
        grammar: str | None,
        logit_bias: tuple[tuple[int, float], ...],
        tokenizer_dir: str,
        eos_token_ids: tuple[int, ...],
        prompt_length: int,
    ) -> None:
        self.grammar = grammar
        self.logit_bias = logit_bias
        self.tokenizer_dir = tokenizer_dir
        self.eos_token_ids = eos_token_ids
        self.consumed = prompt_length
        self.error: str | None = None  # why this request may only end (seen only in the process it runs in)
        self._matcher: LLMatcher | None = None
        self._mask: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_matcher"] = state["_mask"] = None  # native objects: rebuilt in the worker
        return state

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: int | None,
        client_id: int | None,
    ) -> None:
        try:
            with on_stream(logits, stream_ptr):
                if self.logit_bias:
                    apply_logit_bias(logits.view(-1), self.logit_bias)
                if self.grammar is not None:
                    self._mask_logits(logits, token_ids[0])
        except Exception as exc:
            if self.error is None:
                logger.exception("the logits post-processor failed; the request may only end")
                self.error = f"the constraint failed: {exc}"
            keep_only(logits, self.eos_token_ids)

    def _mask_logits(self, logits: torch.Tensor, tokens: Sequence[int]) -> None:
        width = logits.shape[-1]
        if self._matcher is None:
            assert self.grammar is not None
            self._matcher = _grammar_cache(self.tokenizer_dir, width, self.eos_token_ids).matcher(self.grammar)
            self._mask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
        assert self._mask is not None
        new = list(tokens[self.consumed :])
        self.consumed = len(tokens)
        if new and not self._matcher.consume_tokens(new):
            raise RuntimeError(f"the constraint rejected a token: {self._matcher.get_error()}")
        if self._matcher.is_error():
            raise RuntimeError(self._matcher.get_error())
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._mask.numpy(), 0)
        allowed = allowed_tokens(self._mask[0].to(logits.device, non_blocking=True), width)
        logits.masked_fill_(~allowed.view(logits.shape[-1:]), float("-inf"))


class BatchedHook:
    """The executor's batched post-processor: biases by client id, then the guidance masks for the batch."""

    def __init__(self, processor: GuidanceLogitsProcessor, eos_token_ids: Sequence[int]) -> None:
        self.processor = processor
        self._eos = tuple(eos_token_ids)
        self._biases: dict[int, tuple[tuple[int, float], ...]] = {}
        self._failures: dict[int, str] = {}

    def add(self, client_id: int, bias: tuple[tuple[int, float], ...]) -> None:
        if bias:
            self._biases[client_id] = bias

    def remove(self, client_id: int) -> None:
        self._biases.pop(client_id, None)
        self._failures.pop(client_id, None)
        self.processor.remove(client_id)

    def error(self, client_id: int) -> str | None:
        return self._failures.get(client_id) or self.processor.error(client_id)

    def _within_vocabulary(self, logits: list[torch.Tensor]) -> list[torch.Tensor]:
        """Views of ``logits`` as wide as the vocabulary; the columns past it can never be chosen.

        An engine built with tensor parallelism pads its vocabulary to a multiple of the TP size,
        and the logits it hands us are that wide (``vocab_size_padded``). The padding columns are
        no tokens (their logits are 0, not -inf), so they are set to -inf here.
        """
        width = self.processor.vocab_size
        if not logits or logits[0].shape[-1] == width:
            return logits
        if logits[0].shape[-1] < width:
            raise ValueError(f"logits are {logits[0].shape[-1]} wide, narrower than the vocabulary ({width})")
        for row in logits:
            row[..., width:] = float("-inf")
        return [row[..., :width] for row in logits]

    def __call__(
        self,
        req_ids: list[int],
        logits: list[torch.Tensor],
        token_ids: list[list[list[int]]],
        stream_ptr: int,
        client_ids: list[int | None],
    ) -> None:
        try:
            with on_stream(logits[0], stream_ptr) if logits else nullcontext():
                rows = self._within_vocabulary(logits)
                for row, client_id in enumerate(client_ids):
                    bias = self._biases.get(client_id) if client_id is not None else None
                    if bias:
                        apply_logit_bias(rows[row].view(-1), bias)
            for row, client_id in enumerate(client_ids):  # the executor's shape: each row's whole token list
                if client_id is not None:
                    self.processor.consume(client_id, token_ids[row][0])
            self.processor.mask(rows, client_ids, stream_ptr)
        except Exception as exc:
            logger.exception("the batched logits post-processor failed; its requests may only end")
            for row, client_id in enumerate(client_ids):
                if client_id is not None:
                    self._failures.setdefault(client_id, f"the constraint failed: {exc}")
                with on_stream(logits[row], stream_ptr):
                    keep_only(logits[row], self._eos)
