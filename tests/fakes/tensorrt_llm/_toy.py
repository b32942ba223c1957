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


def logits_width_of(engine_dir: str | Path) -> int:
    """An engine built with tensor parallelism pads its vocabulary to a multiple of the TP size
    (``ceil(vocab / tp) * tp``, as TensorRT-LLM's checkpoint converters do), and its logits buffers,
    the ones the post-processor sees, are that wide (``vocab_size_padded``)."""
    config = json.loads((Path(engine_dir) / "config.json").read_text())
    tp_size = int(config["pretrained_config"].get("mapping", {}).get("tp_size", 1))
    vocab = vocab_size_of(engine_dir)
    return -(-vocab // tp_size) * tp_size


class ToyModel:
    step_delay_s = 0.002

    def __init__(self, vocab_size: int, width: int | None = None) -> None:
        self.vocab_size = vocab_size
        self.width = width or vocab_size  # logits wider than the vocabulary: padding columns

    def logits(self, tokens: list[int]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(tokens[-1] * 7919 + len(tokens) % 3)
        real = torch.randn(self.vocab_size, generator=generator)
        # Padded rows of the LM head are zeros, so padding logits are 0, not -inf.
        return torch.cat([real, torch.zeros(self.width - self.vocab_size)])

    @staticmethod
    def sample(logits: torch.Tensor, temperature: float | None, generator: torch.Generator) -> int:
        if not temperature:
            return int(torch.argmax(logits))
        probabilities = torch.softmax(logits / temperature, dim=-1)
        return int(torch.multinomial(probabilities, 1, generator=generator))
