"""Constrained generation on CUDA through the step scheduler, llguidance and the CUDA mask kernel.

The model is SmolLM2-135M's architecture with random weights (the real weights do not travel to
the GPU machine), so whatever comes out is shaped by the grammar alone: every output must match
its constraint. Needs the model's config and tokenizer files in ``LLGTRITON_GPU_MODEL_DIR``
(``bench/gpu_kernel.sh`` passes ``device_carry/model``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from llgtriton.wire import FinishReason
from tests.support.harness import RecordingSink

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
    pytest.mark.skipif(
        not os.environ.get("LLGTRITON_GPU_MODEL_DIR"), reason="LLGTRITON_GPU_MODEL_DIR names the model's files"
    ),
]

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", params=["slots", "growing", "server-defaults"])
def setup(request: pytest.FixtureRequest) -> Any:
    """The step loop on either engine; ``server-defaults`` as the server runs it on CUDA: the slot engine,
    the decode launched ahead and the matchers in mask processes (as many as the server starts)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from backend.assembly import mask_processes_for
    from backend.constraints import Guidance, GuidanceLogitsProcessor
    from backend.cpu_cores import usable_cores
    from backend.masking import bitmask_applier
    from backend.scheduler import Scheduler
    from backend.slot_engine import SlotEngine
    from backend.torch_engine import TorchEngine

    folder = Path(os.environ["LLGTRITON_GPU_MODEL_DIR"])
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda").eval()  # type: ignore[no-untyped-call]
    tokenizer: Any = AutoTokenizer.from_pretrained(folder)
    device = torch.device("cuda")
    slots = request.param != "growing"
    server = request.param == "server-defaults"
    engine = SlotEngine(model, device, slots=8, context=512) if slots else TorchEngine(model, device)
    eos = frozenset({int(tokenizer.eos_token_id)})
    processor = GuidanceLogitsProcessor.for_tokenizer(
        tokenizer,
        engine.vocab_size,
        eos,
        8,
        applier=bitmask_applier(device, engine.vocab_size, 8, shared=server),
        mask_process=server,
        mask_processes=mask_processes_for(usable_cores()) if server else 1,
    )
    scheduler = Scheduler(
        engine,
        tokenizer,
        eos,
        max_batch_size=8,
        max_model_len=512,
        guidance=Guidance.for_processor(processor),
        launch_ahead=server,
    )
    scheduler.start()
    yield scheduler, tokenizer
    scheduler.shutdown()


def generate(setup: Any, grammars: list[str | None], max_tokens: int = 64) -> list[RecordingSink]:
    from backend.requests import EngineRequest, SamplingParams

    scheduler, tokenizer = setup
    sinks = [RecordingSink() for _ in grammars]
    for index, (grammar, sink) in enumerate(zip(grammars, sinks, strict=True)):
        prompt = tuple(tokenizer.encode(f"Request {index}: write JSON."))
        request = EngineRequest(
            str(index), prompt, max_tokens, SamplingParams(temperature=1.0, seed=index), grammar=grammar
        )
        scheduler.submit(request, sink)
    for sink in sinks:
        sink.wait()
    return sinks


def test_random_weights_still_produce_valid_output_on_cuda(setup: Any) -> None:
    from llgtriton.guides import grammar_for
    from llgtriton.wire import GuideType

    person = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))
    digits = grammar_for(GuideType.REGEX, r"[0-9]{3}-[0-9]{4}")
    sinks = generate(setup, [person, digits, None, person, digits, None])
    for sink in sinks:
        assert sink.error is None, sink.error
    texts = [sink.text for sink in sinks]
    for index in (0, 3):
        if sinks[index].outputs[-1].finish_reason is FinishReason.STOP:
            value = json.loads(texts[index])
            assert set(value) == {"name", "age"} and isinstance(value["age"], int)
        else:  # cut by max_tokens: still a prefix of valid JSON for the schema
            assert texts[index].startswith('{"name": "')
    for index in (1, 4):
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", texts[index]), texts[index]
