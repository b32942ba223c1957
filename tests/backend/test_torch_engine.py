"""The torch engine's batched, left-padded KV cache gives the same tokens as one sequence at a time."""

from __future__ import annotations

from typing import Any

import torch

from backend import torch_engine
from backend.torch_engine import TorchEngine
from tests.backend.recording import greedy_alone


def test_sequences_joining_and_leaving_decode_like_single_runs(loaded_model: Any) -> None:
    model = loaded_model.model
    engine = TorchEngine(model, torch.device("cpu"))
    a, b, c = [1, 42, 100, 7, 9], [1, 5, 6], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    got_a = [int(engine.prefill([0], [a])[0].argmax())]
    got_b = [int(engine.prefill([1], [b])[0].argmax())]
    for _ in range(3):
        logits = engine.decode([0, 1], [got_a[-1], got_b[-1]])
        got_a.append(int(logits[0].argmax()))
        got_b.append(int(logits[1].argmax()))
    got_c = [int(engine.prefill([2], [c])[0].argmax())]  # joins a batch whose cache is shorter than its prompt
    engine.release(0)  # leaves: dropped when c joins, its padding columns trimmed away
    for _ in range(2):
        logits = engine.decode([2, 1], [got_c[-1], got_b[-1]])  # rows come back in the order asked for
        got_c.append(int(logits[0].argmax()))
        got_b.append(int(logits[1].argmax()))
    assert got_a == greedy_alone(model, a, 4)
    assert got_b == greedy_alone(model, b, 6)
    assert got_c == greedy_alone(model, c, 3)


def test_releasing_every_sequence_frees_the_batch(loaded_model: Any) -> None:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    first = int(engine.prefill([0], [[1, 2, 3]])[0].argmax())
    engine.decode([0], [first])
    engine.release(0)
    assert engine.rows == 0
    assert engine.vocab_size == loaded_model.model.config.vocab_size
    token = int(engine.prefill([1], [[1, 2]])[0].argmax())
    assert engine.decode([1], [token]).shape == (1, engine.vocab_size)


def test_prompts_prefilled_together_decode_like_single_runs(loaded_model: Any) -> None:
    model = loaded_model.model
    engine = TorchEngine(model, torch.device("cpu"))
    prompts = [[1, 42, 100, 7, 9], [1, 5, 6], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [8]]
    logits = engine.prefill([10, 11, 12, 13], prompts)  # one left-padded forward pass
    got = [[int(row.argmax())] for row in logits]
    for _ in range(3):
        logits = engine.decode([13, 12, 11, 10], [tokens[-1] for tokens in reversed(got)])
        for tokens, row in zip(reversed(got), logits, strict=True):
            tokens.append(int(row.argmax()))
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == greedy_alone(model, prompt, 4)


def test_prefill_splits_a_burst_by_the_token_budget(loaded_model: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(torch_engine, "PREFILL_TOKEN_BUDGET", 8)
    model = loaded_model.model
    engine = TorchEngine(model, torch.device("cpu"))
    calls: list[tuple[int, ...]] = []
    forward = model.forward

    def counting_forward(*args: Any, **kwargs: Any) -> Any:
        calls.append(tuple(kwargs["input_ids"].shape))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    prompts = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11, 12]]
    logits = engine.prefill([0, 1, 2, 3], prompts)
    assert calls == [(2, 2), (1, 3), (1, 5)]  # shortest first, <= 8 padded tokens
    monkeypatch.undo()
    for prompt, row in zip(prompts, logits, strict=True):
        assert int(row.argmax()) == greedy_alone(model, prompt, 1)[0]


def test_leaving_rows_stay_until_a_quarter_are_dead(loaded_model: Any) -> None:
    model = loaded_model.model
    engine = TorchEngine(model, torch.device("cpu"))
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10], [11, 12], [13, 14, 15], [16, 17], [18]]
    got = {seq: [int(row.argmax())] for seq, row in enumerate(engine.prefill(list(range(8)), prompts))}

    def step() -> None:
        seqs = sorted(got)
        for seq, row in zip(seqs, engine.decode(seqs, [got[s][-1] for s in seqs]), strict=True):
            got[seq].append(int(row.argmax()))

    step()
    assert engine.rows == 8
    engine.release(3)
    got.pop(3)
    step()
    assert engine.rows == 8  # one dead row of 8: kept, nothing copied
    engine.release(0)
    got.pop(0)
    step()
    assert engine.rows == 6  # two of 8 dead: compacted
    for seq, tokens in got.items():
        assert tokens == greedy_alone(model, prompts[seq], len(tokens))


def test_a_joiner_released_before_it_joins_is_dropped(loaded_model: Any) -> None:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    logits = engine.prefill([0, 1], [[1, 2, 3], [4, 5]])
    engine.release(1)  # finished on its first token
    assert engine.decode([0], [int(logits[0].argmax())]).shape == (1, engine.vocab_size)
    assert engine.rows == 1
