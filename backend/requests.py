"""What the scheduler runs: immutable requests, and the protocols it talks through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

from llgtriton.reasoning import ReasoningFormat


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit) before the mask

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


class LogitsPostProcessor(Protocol):
    """TensorRT-LLM's per-request logits post-processor signature.

    ``logits`` is a ``[1, 1, vocab_padded]`` view to modify in place; ``token_ids`` holds one list per
    beam with the prompt and every generated token; ``stream_ptr`` is the CUDA stream the logits
    live on (0 on CPU); ``client_id`` is the id the request was submitted with.
    """

    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: int,
        client_id: int | None,
    ) -> None: ...


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    stream: bool = False
    grammar: str | None = None  # an llguidance grammar; the output must match it
    logits_processor: LogitsPostProcessor | None = None
    logprobs: int | None = None  # report logprobs with this many alternatives (None: do not)
    prompt_logprobs: int | None = None  # score the prompt's tokens, with this many alternatives (None: do not)
    kept_tokens: frozenset[int] = frozenset()  # special tokens written into the text (tool-call tags)
    reasoning: ReasoningFormat | None = None  # how the output marks its thinking, when it thinks
    ignore_eos: bool = False  # end tokens do not end the output; max_tokens (or the context) does
    grammar_pressure: bool = False  # the final response reports how hard the grammar pushed
