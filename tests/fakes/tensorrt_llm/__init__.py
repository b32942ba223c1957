"""Fake of ``tensorrt_llm`` 1.2.x (``tensorrt_llm/__init__.py``): ``LLM`` and ``SamplingParams`` at the top."""

from tensorrt_llm.llmapi.llm import LLM
from tensorrt_llm.sampling_params import SamplingParams

__version__ = "1.2.1"

__all__ = ["LLM", "SamplingParams", "__version__"]
