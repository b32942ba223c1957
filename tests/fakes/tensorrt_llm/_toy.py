"""Not part of TensorRT-LLM: the fake's model, shared by the LLM API and the executor fakes.

Every token's logits are a fixed pseudo-random function of the previous token, so outputs are
deterministic and every token of the vocabulary is possible. ``step_delay_s`` paces the steps so
that requests overlap and cancellation can be observed.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def vocab_size_of(model_dir: str | Path) -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    size = config.get("vocab_size") or config["pretrained_config"]["vocab_size"]
    return int(size)


class ToyModel:
    step_delay_s = 0.002

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def logits(self, tokens: list[int]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(tokens[-1] * 7919 + len(tokens) % 3)
        return torch.randn(self.vocab_size, generator=generator)

    @staticmethod
    def sample(logits: torch.Tensor, temperature: float | None, generator: torch.Generator) -> int:
        if not temperature:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits / temperature, dim=-1)
        return int(torch.multinomial(probabilities, 1, generator=generator))
