"""The torch engine's batched, left-padded KV cache gives the same tokens as one sequence at a time."""

from __future__ import annotations

from typing import Any

import torch

from backend.torch_engine import TorchEngine


def greedy_alone(model: Any, prompt: list[int], steps: int) -> list[int]:
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(steps):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
    return out


def test_sequences_joining_and_leaving_decode_like_single_runs(loaded_model: Any) -> None:
    model = loaded_model.model
    engine = TorchEngine(model, torch.device("cpu"))
    a, b, c = [1, 42, 100, 7, 9], [1, 5, 6], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    got_a = [int(engine.prefill(0, a).argmax())]
    got_b = [int(engine.prefill(1, b).argmax())]
    for _ in range(3):
        logits = engine.decode([0, 1], [got_a[-1], got_b[-1]])
        got_a.append(int(logits[0].argmax()))
        got_b.append(int(logits[1].argmax()))
    got_c = [int(engine.prefill(2, c).argmax())]  # joins a batch whose cache is shorter than its prompt
    engine.release(0)  # leaves: its padding columns are trimmed away
    for _ in range(2):
        logits = engine.decode([2, 1], [got_c[-1], got_b[-1]])  # rows come back in the order asked for
        got_c.append(int(logits[0].argmax()))
        got_b.append(int(logits[1].argmax()))
    assert got_a == greedy_alone(model, a, 4)
    assert got_b == greedy_alone(model, b, 6)
    assert got_c == greedy_alone(model, c, 3)


def test_releasing_every_sequence_frees_the_batch(loaded_model: Any) -> None:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    first = int(engine.prefill(0, [1, 2, 3]).argmax())
    engine.decode([0], [first])
    engine.release(0)
    assert engine.vocab_size == loaded_model.model.config.vocab_size
    token = int(engine.prefill(1, [1, 2]).argmax())
    assert engine.decode([1], [token]).shape == (1, engine.vocab_size)
