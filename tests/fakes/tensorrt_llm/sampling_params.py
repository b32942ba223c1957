"""Fake of ``tensorrt_llm/sampling_params.py`` (NVIDIA/TensorRT-LLM @a98a9061, the 1.2 line).

The processor ABCs with their exact call signatures, and ``SamplingParams`` with every field of
that release and its defaults (``@dataclass(slots=True, kw_only=True)``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch


class LogitsProcessor(ABC):
    @abstractmethod
    def __call__(
        self,
        req_id: int,
        logits: torch.Tensor,
        token_ids: list[list[int]],
        stream_ptr: int | None,
        client_id: int | None,
    ) -> None: ...


class BatchedLogitsProcessor(ABC):
    @abstractmethod
    def __call__(
        self,
        req_ids: list[int],
        logits: list[torch.Tensor],
        token_ids: list[list[list[int]]],
        stream_ptr: int,
        client_ids: list[int | None],
    ) -> None: ...


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: Any = None
    bad_token_ids: list[int] | None = None
    stop: Any = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: torch.Tensor | None = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list[str] | None = None
    lookahead_config: Any = None
    guided_decoding: Any = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        self.pad_id = self.pad_id or self.end_id
        self.best_of = self.best_of or self.n
