"""The slot engine on CUDA: decode steps replayed from CUDA graphs give the logits of the eager step.

A random-weight SmolLM2-shaped model (``LLGTRITON_GPU_MODEL_DIR`` holds its config), fp32 so that
the growing-cache engine is a close reference: same tokens in, logits within 1e-3.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on the GPU machine)"),
    pytest.mark.skipif(
        not os.environ.get("LLGTRITON_GPU_MODEL_DIR"), reason="LLGTRITON_GPU_MODEL_DIR names the model's files"
    ),
]

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def model() -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(Path(os.environ["LLGTRITON_GPU_MODEL_DIR"]))
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(CUDA).eval()  # type: ignore[no-untyped-call]


def run(engine: Any, prompts: list[list[int]], steps: int, leave_after: int) -> list[torch.Tensor]:
    """Greedy decoding of every prompt; sequence 0 leaves after ``leave_after`` steps and a new one joins."""
    seqs = list(range(len(prompts)))
    logits = engine.prefill(seqs, prompts)
    history = [logits.float().cpu()]
    tokens = {seq: int(row.argmax()) for seq, row in zip(seqs, logits, strict=True)}
    for step in range(steps):
        if step == leave_after:
            engine.release(0)
            seqs.remove(0)
            joined = engine.prefill([99], [[7] * 150])  # a longer prompt: a wider attention window
            tokens[99] = int(joined[0].argmax())
            seqs.append(99)
        logits = engine.decode(seqs, [tokens[seq] for seq in seqs])
        history.append(logits.float().cpu())
        tokens = {seq: int(row.argmax()) for seq, row in zip(seqs, logits, strict=True)}
    return history


def test_graph_replays_match_the_eager_step_and_the_growing_cache(model: Any) -> None:
    from backend.slot_engine import SlotEngine
    from backend.torch_engine import TorchEngine

    prompts = [[1, 2, 3, 4], list(range(10, 40)), [5] * 120]  # the third crosses 128 columns while decoding
    graphed = SlotEngine(model, CUDA, slots=8, context=512)
    replayed = run(graphed, prompts, steps=12, leave_after=5)
    eager = run(SlotEngine(model, CUDA, slots=8, context=512, cuda_graphs=False), prompts, steps=12, leave_after=5)
    growing = run(TorchEngine(model, CUDA), prompts, steps=12, leave_after=5)
    assert graphed.graphs >= 2  # (4 rows, 128 columns) and (4 rows, 256 columns) at least
    for got, want, reference in zip(replayed, eager, growing, strict=True):
        assert torch.equal(got, want)
        assert (got - reference).abs().max().item() < 1e-3


def test_every_shape_captured_up_front_serves_without_new_captures(model: Any) -> None:
    from backend.slot_engine import SlotEngine

    prompts = [[1, 2, 3, 4], list(range(10, 40)), [5] * 120]
    engine = SlotEngine(model, CUDA, slots=8, context=512)
    assert engine.capture_all() == 4 * 3  # rows 1, 2, 4, 8 x widths 128, 256, 512
    replayed = run(engine, prompts, steps=12, leave_after=5)
    assert engine.graphs == 12
    eager = run(SlotEngine(model, CUDA, slots=8, context=512, cuda_graphs=False), prompts, steps=12, leave_after=5)
    for got, want in zip(replayed, eager, strict=True):
        assert torch.equal(got, want)
