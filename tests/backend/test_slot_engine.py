"""The slot engine (a preallocated KV cache, one slot per sequence) gives the same tokens as one sequence at a time.

On CPU the decode step runs eagerly; ``tests/gpu/test_cuda_slot_engine.py`` replays it from CUDA graphs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from backend import slot_engine
from backend.slot_engine import SlotEngine, cache_bytes, supports
from tests.backend.recording import greedy_alone

CPU = torch.device("cpu")


def decode_greedy(engine: SlotEngine, got: dict[int, list[int]], seqs: list[int]) -> None:
    for seq, row in zip(seqs, engine.decode(seqs, [got[seq][-1] for seq in seqs]), strict=True):
        got[seq].append(int(row.argmax()))


def test_sequences_joining_leaving_and_reusing_slots_decode_like_single_runs(loaded_model: Any) -> None:
    model = loaded_model.model
    engine = SlotEngine(model, CPU, slots=3, context=64)
    a, b, c = [1, 42, 100, 7, 9], [1, 5, 6], [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    got = {seq: [int(row.argmax())] for seq, row in zip((0, 1), engine.prefill([0, 1], [a, b]), strict=True)}
    for _ in range(3):
        decode_greedy(engine, got, [1, 0])  # rows come back in the order asked for
    engine.release(0)
    assert engine.rows == 1
    got[2] = [int(engine.prefill([2], [c])[0].argmax())]  # takes the slot a left, with a's keys still in it
    for _ in range(2):
        decode_greedy(engine, got, [2, 1])
    assert engine.rows == 2
    assert got[0] == greedy_alone(model, a, 4)
    assert got[1] == greedy_alone(model, b, 6)
    assert got[2] == greedy_alone(model, c, 3)


def test_a_sequence_that_skips_steps_keeps_its_cache(loaded_model: Any) -> None:
    model = loaded_model.model
    engine = SlotEngine(model, CPU, slots=4, context=64)
    a, b = [1, 42, 100], [1, 5, 6, 7]
    got = {seq: [int(row.argmax())] for seq, row in zip((0, 1), engine.prefill([0, 1], [a, b]), strict=True)}
    for _ in range(3):
        decode_greedy(engine, got, [1])  # slot 0 is in the step's rows but not decoding
    for _ in range(2):
        decode_greedy(engine, got, [0, 1])
    assert got[0] == greedy_alone(model, a, 3)
    assert got[1] == greedy_alone(model, b, 6)


def test_sequences_growing_across_attention_widths(loaded_model: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(slot_engine, "WIDTH_STEP", 4)  # widths 4, 8, 16 within a dozen tokens
    model = loaded_model.model
    engine = SlotEngine(model, CPU, slots=2, context=20)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    got = {seq: [int(row.argmax())] for seq, row in enumerate(engine.prefill([0, 1], prompts))}
    for _ in range(10):
        decode_greedy(engine, got, [0, 1])
    for seq, prompt in enumerate(prompts):
        assert got[seq] == greedy_alone(model, prompt, 11)


def test_limits_are_clear_errors(loaded_model: Any) -> None:
    engine = SlotEngine(loaded_model.model, CPU, slots=1, context=8)
    with pytest.raises(ValueError, match="no room in a context of 8"):
        engine.prefill([0], [list(range(1, 9))])
    first = int(engine.prefill([0], [[1, 2, 3, 4, 5, 6, 7]])[0].argmax())
    with pytest.raises(RuntimeError, match="only 0 of 1 slots are free"):
        engine.prefill([1], [[1]])
    engine.decode([0], [first])  # the 8th token: the context is full
    with pytest.raises(ValueError, match="reached the context length"):
        engine.decode([0], [first])


def test_models_it_cannot_run_are_named() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
    assert supports(gpt2) == "model type 'gpt2' (the slot engine runs Llama-family models)"
    with pytest.raises(ValueError, match="cannot run this model"):
        SlotEngine(gpt2, CPU, slots=1, context=8)


def test_auto_on_cuda_falls_back_to_the_growing_cache_for_other_models(caplog: pytest.LogCaptureFixture) -> None:
    from backend.assembly import torch_engine
    from backend.torch_engine import TorchEngine
    from llgtriton.settings import EngineSettings

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8))
    # Decided before any CUDA call (and before reading Llama-only config fields), so it runs without a GPU.
    engine = torch_engine(EngineSettings(device="cuda"), gpt2, 8)
    assert isinstance(engine, TorchEngine)
    assert "growing, not preallocated slots: model type 'gpt2'" in caplog.text


def test_cache_size_is_slots_times_context(loaded_model: Any) -> None:
    config = loaded_model.model.config  # SmolLM2-135M: 30 layers, 3 KV heads of 64, fp32 here
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * 64 * 4
    assert per_token == 46080
    assert cache_bytes(loaded_model.model, slots=8, context=1024) == 8 * 1025 * per_token


def test_the_setting_picks_the_engine(loaded_model: Any) -> None:
    from backend.assembly import torch_engine
    from backend.torch_engine import TorchEngine
    from llgtriton.settings import EngineSettings

    model = loaded_model.model
    assert isinstance(torch_engine(EngineSettings(), model, 64), TorchEngine)  # auto: growing on CPU
    slots = torch_engine(EngineSettings(kv_cache="slots", max_batch_size=3), model, 64)
    assert isinstance(slots, SlotEngine)
    slots.prefill([0, 1, 2], [[1], [2], [3]])
    with pytest.raises(RuntimeError, match="only 0 of 3 slots are free"):
        slots.prefill([3], [[4]])
