"""The response pump: responses leave the engine's thread, in order, joined only when sending falls behind."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.response_pump import ResponsePump, merged
from llgtriton.wire import FinishReason, GenerationOutput, PromptLogprobs, TokenLogprob

WAIT_S = 10.0


class GatedSink:
    """Records responses; each send waits for the gate, so a test decides when sending keeps up."""

    def __init__(self, *, open_gate: bool = True) -> None:
        self.responses: list[tuple[GenerationOutput, bool]] = []
        self.errors: list[Exception] = []
        self.cancelled = False
        self.checks = 0
        self.gate = threading.Event()
        self.sending = threading.Event()  # a send has started
        self.received = threading.Condition()
        if open_gate:
            self.gate.set()

    def send(self, output: GenerationOutput, *, final: bool) -> None:
        self.sending.set()
        assert self.gate.wait(WAIT_S)
        with self.received:
            self.responses.append((output, final))
            self.received.notify_all()

    def fail(self, error: Exception) -> None:
        with self.received:
            self.errors.append(error)
            self.received.notify_all()

    def is_cancelled(self) -> bool:
        self.checks += 1
        return self.cancelled

    def wait_for(self, responses: int = 0, errors: int = 0) -> None:
        with self.received:
            assert self.received.wait_for(
                lambda: len(self.responses) >= responses and len(self.errors) >= errors, WAIT_S
            ), f"got {len(self.responses)} responses and {len(self.errors)} errors"


def token(text: str, count: int, finish: FinishReason | None = None) -> GenerationOutput:
    return GenerationOutput(text, finish, prompt_tokens=3, completion_tokens=count)


@pytest.fixture
def pump() -> Iterator[ResponsePump]:
    running = ResponsePump(check_interval_s=0.01)
    yield running
    running.close()


def test_when_sending_keeps_up_every_output_is_its_own_response(pump: ResponsePump) -> None:
    sink = GatedSink()
    pumped = pump.wrap(sink, "request")
    outputs = [token("a", 1), token("b", 2), token("c", 3, FinishReason.LENGTH)]
    for index, output in enumerate(outputs):
        pumped.send(output, final=index == 2)
        sink.wait_for(responses=index + 1)
    assert sink.responses == [(outputs[0], False), (outputs[1], False), (outputs[2], True)]


def test_outputs_queued_while_a_send_is_slow_leave_as_one_response(pump: ResponsePump) -> None:
    sink = GatedSink(open_gate=False)
    pumped = pump.wrap(sink, "request")
    pumped.send(token("He", 1), final=False)
    assert sink.sending.wait(WAIT_S)  # the pump is stuck in this send: what follows queues
    for count, text in enumerate(["llo", ",", " wor"], start=2):
        pumped.send(token(text, count), final=False)
    pumped.send(token("ld", 5, FinishReason.STOP), final=True)
    sink.gate.set()
    sink.wait_for(responses=2)
    assert sink.responses == [(token("He", 1), False), (token("llo, world", 5, FinishReason.STOP), True)]


def test_the_engine_thread_does_not_wait_for_a_slow_send(pump: ResponsePump) -> None:
    sink = GatedSink(open_gate=False)
    pumped = pump.wrap(sink, "request")
    started = time.monotonic()
    for count in range(1, 101):
        pumped.send(token("x", count), final=count == 100)
    assert time.monotonic() - started < 1.0
    sink.gate.set()
    pump.close()
    assert "".join(output.text for output, _ in sink.responses) == "x" * 100
    assert len(sink.responses) <= 3  # the first send, what queued behind it, and perhaps a straggler
    assert sink.responses[-1][0].completion_tokens == 100 and sink.responses[-1][1]


def test_joined_responses_carry_every_token_logprob() -> None:
    first = TokenLogprob(b"a", -0.5)
    second = TokenLogprob(b"b", -1.5)
    joined = merged(
        [
            GenerationOutput("a", None, 3, 1, (first,)),
            GenerationOutput("", None, 3, 2, ()),  # a token that completed no character yet
            GenerationOutput("b", FinishReason.LENGTH, 3, 3, (second,)),
        ]
    )
    assert joined == GenerationOutput("ab", FinishReason.LENGTH, 3, 3, (first, second))
    assert merged([token("a", 1), token("b", 2)]).logprobs is None


def test_a_first_response_joined_with_the_next_still_names_its_formats_and_prompt_logprobs(
    pump: ResponsePump,
) -> None:
    """What only a request's first response carries (the formats the proxy reads its calls and its
    thinking by, the prompt's logprobs) survives being joined while the pump is busy elsewhere."""
    busy, joined = GatedSink(open_gate=False), GatedSink()
    pump.wrap(busy, "busy").send(token("x", 1), final=False)
    assert busy.sending.wait(WAIT_S)  # the pump is stuck sending another request's response
    prompt = PromptLogprobs(b"Hi", (TokenLogprob(b"!", -0.25),))
    first = GenerationOutput(
        "<tool_call>", prompt_tokens=2, completion_tokens=1, prompt_logprobs=prompt, tool_call_format="hermes"
    )
    pumped = pump.wrap(joined, "joined")
    pumped.send(dataclasses.replace(first, reasoning_format="qwen3"), final=False)
    pumped.send(GenerationOutput('{"name"', prompt_tokens=2, completion_tokens=2), final=False)
    busy.gate.set()
    joined.wait_for(responses=1)
    (response, final), *_ = joined.responses
    assert response.text == '<tool_call>{"name"' and response.completion_tokens == 2 and not final
    assert (response.tool_call_format, response.reasoning_format) == ("hermes", "qwen3")
    assert response.prompt_logprobs == prompt


def test_a_failure_follows_the_outputs_queued_before_it(pump: ResponsePump) -> None:
    sink = GatedSink(open_gate=False)
    pumped = pump.wrap(sink, "request")
    pumped.send(token("a", 1), final=False)
    assert sink.sending.wait(WAIT_S)
    pumped.send(token("b", 2), final=False)
    error = RuntimeError("the engine failed")
    pumped.fail(error)
    sink.gate.set()
    sink.wait_for(responses=2, errors=1)
    assert [output.text for output, final in sink.responses if not final] == ["a", "b"]
    assert sink.errors == [error]


def test_nothing_is_sent_after_the_final_response(pump: ResponsePump) -> None:
    sink = GatedSink()
    pumped = pump.wrap(sink, "request")
    pumped.send(token("a", 1, FinishReason.STOP), final=True)
    pumped.send(token("b", 2), final=False)
    pumped.fail(RuntimeError("late"))
    sink.wait_for(responses=1)
    pump.close()
    assert sink.responses == [(token("a", 1, FinishReason.STOP), True)]
    assert sink.errors == []


def test_a_cancellation_is_seen_within_the_check_interval(pump: ResponsePump) -> None:
    sink = GatedSink()
    pumped = pump.wrap(sink, "request")
    time.sleep(0.05)
    assert not pumped.is_cancelled()
    sink.cancelled = True
    deadline = time.monotonic() + WAIT_S
    while not pumped.is_cancelled():
        assert time.monotonic() < deadline, "the cancellation was never seen"
        time.sleep(0.005)


def test_requests_that_ended_or_were_refused_are_no_longer_checked(pump: ResponsePump) -> None:
    ended, refused = GatedSink(), GatedSink()
    pump.wrap(ended, "request").send(token("a", 1, FinishReason.STOP), final=True)
    pump.wrap(refused, "request").discard()
    ended.wait_for(responses=1)
    checks = ended.checks, refused.checks
    time.sleep(0.3)  # an open request is checked every 10 ms here: about 30 times
    # (At most one check may have been under way when the request ended or was discarded.)
    assert ended.checks - checks[0] <= 1 and refused.checks - checks[1] <= 1


def test_close_sends_what_is_queued() -> None:
    pump = ResponsePump()
    sink = GatedSink(open_gate=False)
    pumped = pump.wrap(sink, "request")
    pumped.send(token("a", 1), final=False)
    pumped.send(token("b", 2, FinishReason.LENGTH), final=True)
    sink.gate.set()
    pump.close()
    assert "".join(output.text for output, _ in sink.responses) == "ab"
    assert sink.responses[-1][1]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.text(max_size=3)), min_size=1, max_size=40),
    st.floats(0.0, 0.001),
)
def test_each_request_gets_its_own_text_in_order_and_one_final(sends: list[tuple[int, str]], delay: float) -> None:
    class SlowSink(GatedSink):
        def send(self, output: GenerationOutput, *, final: bool) -> None:
            time.sleep(delay)
            super().send(output, final=final)

    pump = ResponsePump()
    sinks = [SlowSink() for _ in range(3)]
    pumped = [pump.wrap(sink, f"request-{index}") for index, sink in enumerate(sinks)]
    sent: list[list[str]] = [[], [], []]
    for request, text in sends:
        sent[request].append(text)
        pumped[request].send(token(text, len(sent[request])), final=False)
    for request in range(3):
        pumped[request].send(token("", len(sent[request]), FinishReason.LENGTH), final=True)
    pump.close()
    for request, sink in enumerate(sinks):
        assert "".join(output.text for output, _ in sink.responses) == "".join(sent[request])
        assert [final for _, final in sink.responses] == [False] * (len(sink.responses) - 1) + [True]
        counts = [output.completion_tokens for output, _ in sink.responses]
        assert counts == sorted(counts) and counts[-1] == len(sent[request])
