"""The composition root: the backend's parts put together for ``settings.engine``, in this process.

``backend.entry`` calls :func:`start_in_process` for a stub that runs its engine itself, and the
engine core (``backend.core_process``) calls it for a stub whose engine runs apart.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from transformers import PreTrainedModel

from backend.chat_template import ChatTemplate
from backend.constraints import Guidance, GuidanceLogitsProcessor
from backend.contract import Service
from backend.cpu_cores import usable_cores
from backend.engine import Engine
from backend.masking import bitmask_applier
from backend.model_loader import load_model
from backend.response_pump import pump_for
from backend.scheduler import Scheduler
from backend.service import GenerationService, Runner
from backend.slot_engine import SlotEngine, cache_bytes, supports
from backend.synthetic import SyntheticService
from backend.torch_engine import TorchEngine
from llgtriton.settings import EngineSettings

logger = logging.getLogger(__name__)


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


def mask_processes_for(cores: int) -> int:
    """Mask processes for ``cores`` usable cores: one for every four, at most four. (On the H200's 16
    cores four children computed a step's 256 masks in 0.4 to 0.7 of one's time; docs/benchmarks.md.)"""
    return max(1, min(4, cores // 4))


def start_in_process(settings: EngineSettings) -> Service:
    """The service for ``settings.engine``, with its engine in this process."""
    if settings.engine == "synthetic":
        return SyntheticService(settings)
    if settings.engine == "trtllm":
        from backend.trtllm.start import start_runner  # imports TensorRT-LLM

        model, runner = start_runner(settings)
        service = front_door(settings, model.tokenizer, runner, model.vocab_size, model.max_model_len)
        logger.info("ready: %s on TensorRT-LLM (%s), context %d tokens", model.name, model.kind, model.max_model_len)
        return service
    return start_torch_service(settings)


def start_torch_service(settings: EngineSettings) -> GenerationService:
    """The torch engine's service: the model loaded, the step loop started."""
    loaded = load_model(settings)
    engine = torch_engine(settings, loaded.model, loaded.max_model_len)
    device = torch.device(settings.device)
    # Apart from the step loop's GIL the masks kept up at 256 rows on the H200 (issue 51); a CPU has
    # few cores to spare for a second process.
    mask_process = settings.mask_process == "on" or (settings.mask_process == "auto" and device.type == "cuda")
    processor = GuidanceLogitsProcessor.for_tokenizer(
        loaded.tokenizer,
        engine.vocab_size,
        loaded.eos_token_ids,
        settings.max_batch_size,
        applier=bitmask_applier(device, engine.vocab_size, settings.max_batch_size, shared=mask_process),
        mask_process=mask_process,
        mask_processes=settings.mask_processes or mask_processes_for(usable_cores()),
    )
    scheduler = Scheduler(
        engine,
        loaded.tokenizer,
        loaded.eos_token_ids,
        max_batch_size=settings.max_batch_size,
        max_model_len=loaded.max_model_len,
        guidance=Guidance.for_processor(processor),
        max_queue_size=settings.max_queue_size,
        max_kv_tokens=settings.max_kv_tokens,
        token_bytes=lambda token: bytes(processor.tokenizer.decode_bytes([token])),
        # On the CPU a pass runs as it is queued: launched ahead, it would only hold the tokens back.
        launch_ahead=settings.launch_ahead and device.type == "cuda",
    )
    scheduler.start()
    logger.info(
        "ready: %s, context %d tokens, batch %d",
        loaded.path.name,
        loaded.max_model_len,
        settings.max_batch_size,
    )
    return front_door(settings, loaded.tokenizer, scheduler, engine.vocab_size, loaded.max_model_len)


def front_door(
    settings: EngineSettings, tokenizer: Any, runner: Runner, vocab_size: int, max_model_len: int
) -> GenerationService:
    """The service in front of ``runner``: the model's chat template, the response pump if asked for."""
    return GenerationService(
        tokenizer,
        ChatTemplate(tokenizer, settings.chat_template, settings.tool_call_parser, settings.reasoning_parser),
        runner,
        vocab_size=vocab_size,
        max_model_len=max_model_len,
        pump=pump_for(settings),
        max_admitting=settings.max_queue_size,
    )
