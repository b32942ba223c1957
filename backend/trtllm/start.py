"""Start the trtllm engine: the LLM API for a checkpoint, the executor for a prebuilt engine."""

from __future__ import annotations

import logging

from backend.trtllm.executor import ExecutorRunner
from backend.trtllm.llm_api import LlmApiRunner
from backend.trtllm.model_files import TrtllmModel, load_model_files
from llgtriton.settings import EngineSettings

logger = logging.getLogger(__name__)

# The TensorRT-LLM release this adapter is written and tested (against tests/fakes) for.
SUPPORTED_SERIES = "1.2."


def start_runner(settings: EngineSettings) -> tuple[TrtllmModel, LlmApiRunner | ExecutorRunner]:
    import tensorrt_llm

    if not tensorrt_llm.__version__.startswith(SUPPORTED_SERIES):
        logger.warning(
            "TensorRT-LLM %s is installed; llgtriton is built for %sx (its executor API is removed after 1.2)",
            tensorrt_llm.__version__,
            SUPPORTED_SERIES,
        )
    model = load_model_files(settings)
    runner: LlmApiRunner | ExecutorRunner
    if model.kind == "engine":
        import tensorrt_llm.bindings.executor as trtllm

        logger.info("loading the engine %s through the executor", model.model_dir)
        runner = ExecutorRunner(trtllm, model, settings)
    else:
        from tensorrt_llm.llmapi import KvCacheConfig

        logger.info("loading the checkpoint %s through the LLM API (PyTorch backend)", model.model_dir)
        llm = tensorrt_llm.LLM(
            model=str(model.model_dir),
            tokenizer=str(model.tokenizer_dir),
            skip_tokenizer_init=True,  # we tokenize and detokenize; end and pad ids are set per request
            tensor_parallel_size=settings.tensor_parallel_size,
            pipeline_parallel_size=settings.pipeline_parallel_size,
            dtype=settings.dtype,
            max_batch_size=settings.max_batch_size,
            max_seq_len=model.max_model_len,
            kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=settings.kv_cache_memory_fraction),
        )
        runner = LlmApiRunner(
            llm, tensorrt_llm.SamplingParams, model, max_waiting=settings.max_batch_size + settings.max_queue_size
        )
    runner.start()
    return model, runner
