"""The step scheduler with the real model: batching, the logits post-processor hook, cancellation."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from backend.engine import Engine, PromptScores
from backend.errors import BackendError, InvalidRequest, Unavailable
from backend.requests import EngineRequest, LogitsPostProcessor, SamplingParams
from backend.scheduler import Scheduler
from backend.slot_engine import SlotEngine
from backend.torch_engine import TorchEngine
from llgtriton.wire import FinishReason, GenerationOutput
from tests.backend.recording import run
from tests.support.harness import RecordingSink

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(params=["growing", "slots", "slots, launched ahead"])
def scheduler(loaded_model: Any, request: pytest.FixtureRequest) -> Iterator[Scheduler]:
    cpu = torch.device("cpu")
    engine: Engine = (
        SlotEngine(loaded_model.model, cpu, slots=2, context=512)
        if request.param.startswith("slots")
        else TorchEngine(loaded_model.model, cpu)
    )
    running = Scheduler(
        engine,
        loaded_model.tokenizer,
        loaded_model.eos_token_ids,
        max_batch_size=2,
        max_model_len=512,
        launch_ahead=request.param.endswith("ahead"),
    )
    running.start()
    yield running
    running.shutdown()


def request(tokenizer: Any, prompt: str, max_tokens: int = 8, **kwargs: Any) -> EngineRequest:
    return EngineRequest(
        request_id=prompt,
        prompt_ids=tuple(tokenizer.encode(prompt)),
        max_tokens=max_tokens,
        sampling=kwargs.pop("sampling", GREEDY),
        **kwargs,
    )


def test_batched_requests_match_requests_run_alone(scheduler: Scheduler, tokenizer: Any) -> None:
    prompts = ["The sky is", "My favourite food is", "Python is a", "Once upon a time"]
    alone = [run(scheduler, request(tokenizer, p))[0].text for p in prompts]
    together = run(scheduler, *(request(tokenizer, p) for p in prompts))  # batch 2: two wait in the queue
    assert [sink.text for sink in together] == alone
    assert all(sink.outputs[-1].finish_reason == FinishReason.LENGTH for sink in together)
    assert scheduler.load() == (0, 0)


def test_streaming_sends_deltas_and_one_final(scheduler: Scheduler, tokenizer: Any) -> None:
    (whole,) = run(scheduler, request(tokenizer, "The sky is", max_tokens=10))
    (streamed,) = run(scheduler, request(tokenizer, "The sky is", max_tokens=10, stream=True))
    assert len(whole.outputs) == 1
    assert len(streamed.outputs) > 2
    assert streamed.text == whole.text
    assert [o.finish_reason for o in streamed.outputs[:-1]] == [None] * (len(streamed.outputs) - 1)
    assert streamed.outputs[-1].completion_tokens == 10


class RecordingProcessor:
    """Bans or forces tokens through TensorRT-LLM's logits post-processor signature."""

    def __init__(self, *, ban: set[int] | None = None, only: int | None = None) -> None:
        self.calls: list[tuple[int, tuple[int, ...], list[list[int]], int, int | None]] = []
        self._ban = ban or set()
        self._only = only

    def __call__(
        self, req_id: int, logits: torch.Tensor, token_ids: list[list[int]], stream_ptr: int, client_id: int | None
    ) -> None:
        self.calls.append((req_id, tuple(logits.shape), token_ids, stream_ptr, client_id))
        if self._only is not None:
            keep = logits[..., self._only].clone()
            logits.fill_(float("-inf"))
            logits[..., self._only] = keep
        for token in self._ban:
            logits[..., token] = float("-inf")


def test_logits_post_processor_sees_tensorrt_llm_arguments_and_steers_sampling(
    scheduler: Scheduler, tokenizer: Any
) -> None:
    (free,) = run(scheduler, request(tokenizer, "The sky is", max_tokens=6))
    free_ids = set(tokenizer.encode(free.text, add_special_tokens=False))
    banning = RecordingProcessor(ban=free_ids)
    processor: LogitsPostProcessor = banning
    (banned,) = run(scheduler, request(tokenizer, "The sky is", max_tokens=6, logits_processor=processor))
    assert free_ids.isdisjoint(tokenizer.encode(banned.text, add_special_tokens=False))

    prompt = tuple(tokenizer.encode("The sky is"))
    req_id, shape, token_ids, stream_ptr, client_id = banning.calls[0]
    assert shape == (1, 1, scheduler._engine.vocab_size)
    assert token_ids == [list(prompt)]
    assert stream_ptr == 0 and client_id == req_id
    assert len(banning.calls) == 6
    assert banning.calls[-1][2][0][: len(prompt)] == list(prompt) and len(banning.calls[-1][2][0]) == len(prompt) + 5

    x_token = tokenizer.encode("x", add_special_tokens=False)[0]
    (forced,) = run(
        scheduler, request(tokenizer, "The sky is", max_tokens=5, logits_processor=RecordingProcessor(only=x_token))
    )
    assert forced.text == "x" * 5


def test_a_row_steered_by_its_hook_or_bias_leaves_its_batch_mate_alone(scheduler: Scheduler, tokenizer: Any) -> None:
    (alone,) = run(scheduler, request(tokenizer, "Python is a", max_tokens=5))
    x_token, y_token = (tokenizer.encode(letter, add_special_tokens=False)[0] for letter in ("x", "y"))
    hooked, mate = run(
        scheduler,
        request(tokenizer, "The sky is", max_tokens=5, logits_processor=RecordingProcessor(only=x_token)),
        request(tokenizer, "Python is a", max_tokens=5),
    )
    assert hooked.text == "x" * 5 and mate.text == alone.text
    biased, mate = run(
        scheduler,
        request(
            tokenizer,
            "The sky is",
            max_tokens=5,
            sampling=SamplingParams(temperature=0.0, logit_bias=((y_token, 100.0),)),
        ),
        request(tokenizer, "Python is a", max_tokens=5),
    )
    assert biased.text == "y" * 5 and mate.text == alone.text


def test_a_failing_processor_fails_only_its_request(scheduler: Scheduler, tokenizer: Any) -> None:
    def broken(
        req_id: int, logits: torch.Tensor, token_ids: list[list[int]], stream_ptr: int, client_id: int | None
    ) -> None:
        raise InvalidRequest("grammar rejected the token")

    bad, good = run(
        scheduler,
        request(tokenizer, "The sky is", logits_processor=broken),
        request(tokenizer, "Python is a"),
    )
    assert isinstance(bad.error, InvalidRequest)
    assert good.error is None and good.outputs[-1].finish_reason == FinishReason.LENGTH


def test_cancelled_request_ends_with_a_final_response_and_frees_its_slot(scheduler: Scheduler, tokenizer: Any) -> None:
    cancelled = RecordingSink(cancel_after=2)
    scheduler.submit(request(tokenizer, "Once upon a time", max_tokens=200, stream=True), cancelled)
    cancelled.wait()
    assert cancelled.outputs[-1].finish_reason is None
    assert cancelled.outputs[-1].completion_tokens < 10
    (after,) = run(scheduler, request(tokenizer, "The sky is"))
    assert after.outputs[-1].finish_reason == FinishReason.LENGTH
    assert scheduler.load() == (0, 0)


def test_stop_strings_end_generation(scheduler: Scheduler, tokenizer: Any) -> None:
    (free,) = run(scheduler, request(tokenizer, "Once upon a time", max_tokens=20))
    stop = free.text[6:11]
    (stopped,) = run(scheduler, request(tokenizer, "Once upon a time", max_tokens=20, stop=(stop,), stream=True))
    assert stopped.text == free.text[: free.text.find(stop)]
    assert stopped.outputs[-1].finish_reason == FinishReason.STOP
    assert stopped.outputs[-1].completion_tokens < 20


def test_a_request_ending_early_leaves_its_batch_mate_as_it_would_run_alone(
    scheduler: Scheduler, tokenizer: Any
) -> None:
    (alone,) = run(scheduler, request(tokenizer, "Python is a", max_tokens=12))
    (free,) = run(scheduler, request(tokenizer, "Once upon a time", max_tokens=20))
    stop = free.text[6:11]
    stopped, beside = run(
        scheduler,
        request(tokenizer, "Once upon a time", max_tokens=20, stop=(stop,), stream=True),
        request(tokenizer, "Python is a", max_tokens=12),
    )
    assert stopped.outputs[-1].finish_reason == FinishReason.STOP and beside.text == alone.text
    cancelled, beside = RecordingSink(cancel_after=2), RecordingSink()
    scheduler.submit(request(tokenizer, "Once upon a time", max_tokens=200, stream=True), cancelled)
    scheduler.submit(request(tokenizer, "Python is a", max_tokens=12), beside)
    cancelled.wait()
    beside.wait()
    assert cancelled.outputs[-1].completion_tokens < 10 and beside.text == alone.text
    assert scheduler.load() == (0, 0)


def test_a_full_queue_refuses_at_once(loaded_model: Any, tokenizer: Any) -> None:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    idle = Scheduler(
        engine, tokenizer, loaded_model.eos_token_ids, max_batch_size=1, max_model_len=512, max_queue_size=2
    )  # not started: nothing leaves the queue
    idle.submit(request(tokenizer, "a"), RecordingSink())
    idle.submit(request(tokenizer, "b"), RecordingSink())
    with pytest.raises(Unavailable, match="queue is full"):
        idle.submit(request(tokenizer, "c"), RecordingSink())
    assert idle.load() == (0, 2)


class TimedSink(RecordingSink):
    def __init__(self) -> None:
        super().__init__()
        self.first_at = self.final_at = 0.0

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        now = time.monotonic()
        self.first_at = self.first_at or now
        if final:
            self.final_at = now
        super().send(output, final=final)


def test_the_kv_budget_holds_back_requests_that_would_exceed_it(loaded_model: Any, tokenizer: Any) -> None:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    prompt = "The sky is"
    need = len(tokenizer.encode(prompt)) + 6
    bounded = Scheduler(
        engine, tokenizer, loaded_model.eos_token_ids, max_batch_size=4, max_model_len=512, max_kv_tokens=need + 2
    )
    bounded.start()
    try:
        first, second = TimedSink(), TimedSink()
        bounded.submit(request(tokenizer, prompt, max_tokens=6, stream=True), first)
        bounded.submit(request(tokenizer, prompt, max_tokens=6, stream=True), second)
        first.wait()
        second.wait()
    finally:
        bounded.shutdown()
    assert second.first_at >= first.final_at  # the budget fits one at a time: the second waited
    assert second.text == first.text


def test_a_request_larger_than_the_kv_budget_is_refused_not_queued(loaded_model: Any, tokenizer: Any) -> None:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    small = Scheduler(
        engine, tokenizer, loaded_model.eos_token_ids, max_batch_size=1, max_model_len=512, max_kv_tokens=16
    )
    with pytest.raises(InvalidRequest, match="budget is 16"):
        small.submit(request(tokenizer, "The sky is", max_tokens=20), RecordingSink())
    assert small.load() == (0, 0)


# Prompt scoring (echo with logprobs) ---------------------------------------------------------


def reference_scores(loaded_model: Any, prompt: tuple[int, ...]) -> torch.Tensor:
    """The model's log probabilities over the vocabulary at every prompt position, from one plain forward pass."""
    with torch.inference_mode():
        logits = loaded_model.model(input_ids=torch.tensor([prompt])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_the_prompt_is_scored_token_by_token(
    scheduler: Scheduler, loaded_model: Any, tokenizer: Any, max_tokens: int
) -> None:
    scored = request(tokenizer, "The capital of France is Paris", max_tokens=max_tokens, prompt_logprobs=2)
    (sink,) = run(scheduler, scored)
    prompt = scored.prompt_ids
    first = sink.outputs[0].prompt_logprobs
    assert first is not None
    assert all(output.prompt_logprobs is None for output in sink.outputs[1:])
    assert first.first == tokenizer.decode([prompt[0]]).encode()
    assert [entry.token for entry in first.rest] == [tokenizer.decode([t]).encode() for t in prompt[1:]]
    reference = reference_scores(loaded_model, prompt)
    expected = [float(reference[i, token]) for i, token in enumerate(prompt[1:])]
    assert [entry.logprob for entry in first.rest] == pytest.approx(expected, abs=1e-3)
    best = reference[:-1].topk(2, dim=-1)
    for entry, values in zip(first.rest, best.values.tolist(), strict=True):
        assert [a.logprob for a in entry.top] == pytest.approx(values, abs=1e-3)
    last = sink.outputs[-1]
    assert (last.finish_reason, last.completion_tokens) == (FinishReason.LENGTH, max_tokens)
    assert scheduler.load() == (0, 0)


def test_scoring_does_not_change_what_is_generated(scheduler: Scheduler, tokenizer: Any) -> None:
    (plain,) = run(scheduler, request(tokenizer, "Once upon a time", max_tokens=6))
    (scored,) = run(scheduler, request(tokenizer, "Once upon a time", max_tokens=6, prompt_logprobs=0))
    assert scored.text == plain.text
    prompt_logprobs = scored.outputs[0].prompt_logprobs
    assert prompt_logprobs is not None and all(entry.top == () for entry in prompt_logprobs.rest)


class ScoringFails(TorchEngine):
    def score_prompt(self, prompt: Sequence[int], top: int) -> PromptScores:
        raise RuntimeError("out of memory")


def test_a_prompt_that_fails_to_score_fails_only_its_own_request(loaded_model: Any, tokenizer: Any) -> None:
    engine = ScoringFails(loaded_model.model, torch.device("cpu"))
    running = Scheduler(engine, loaded_model.tokenizer, loaded_model.eos_token_ids, max_batch_size=2, max_model_len=512)
    running.start()
    try:
        plain, scored = run(
            running,
            request(tokenizer, "Once upon a time", max_tokens=6),
            request(tokenizer, "The sky is", max_tokens=6, prompt_logprobs=1),
        )
    finally:
        running.shutdown()
    assert plain.error is None and plain.outputs[-1].completion_tokens == 6
    assert isinstance(scored.error, BackendError) and "scoring the prompt failed" in str(scored.error)
