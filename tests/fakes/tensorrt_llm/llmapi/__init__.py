"""Fake of ``tensorrt_llm.llmapi`` (1.2 line): ``LLM`` and the pydantic ``KvCacheConfig``."""

from dataclasses import dataclass

from tensorrt_llm.llmapi.llm import LLM


@dataclass(kw_only=True)
class KvCacheConfig:
    """``tensorrt_llm/llmapi/llm_args.py`` KvCacheConfig: the fields llgtriton sets."""

    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9


__all__ = ["LLM", "KvCacheConfig"]
