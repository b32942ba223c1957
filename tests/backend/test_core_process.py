"""The engine in a process of its own (the synthetic engine, which needs no model): requests and their
outputs across the pipe, refusals, cancellation, the core dying and coming back, the stub going away."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.core_process import CoreProcess, CoreRendezvous
from backend.core_server import run_core
from backend.errors import InvalidRequest, Unavailable
from backend.response_pump import ResponsePump
from llgtriton.settings import EngineSettings
from llgtriton.wire import FinishReason, GenerationRequest
from tests.support.harness import RecordingSink

SYNTHETIC = EngineSettings(engine="synthetic", core_process="on")
ENDLESS = GenerationRequest(prompt="a b", max_tokens=10**8, stream=True)


@pytest.fixture(scope="module")
def core() -> Iterator[CoreProcess]:
    running = CoreProcess(SYNTHETIC, ResponsePump())  # (as Triton's stub runs it; each core takes ~3 s to start)
    yield running
    running.shutdown()


def test_outputs_come_back_in_order_and_end_final(core: CoreProcess) -> None:
    sinks = [RecordingSink() for _ in range(8)]
    for index, sink in enumerate(sinks):
        core.submit(GenerationRequest(prompt="a b c", max_tokens=50, stream=True), f"r{index}", sink)
    for sink in sinks:
        sink.wait(30)
        assert sink.error is None
        assert sink.text == " token" * 50
        assert [tokens for _, tokens in sink.stamps] == sorted(tokens for _, tokens in sink.stamps)
        assert sink.outputs[-1].finish_reason is FinishReason.LENGTH and sink.outputs[-1].completion_tokens == 50


def test_a_refusal_in_the_core_fails_the_request_with_its_kind(core: CoreProcess) -> None:
    sink = RecordingSink()
    core.submit(GenerationRequest(prompt="x", max_tokens=0), "bad", sink)
    sink.wait(30)
    assert isinstance(sink.error, InvalidRequest) and "max_tokens" in str(sink.error)


def test_a_cancelled_request_ends_in_the_core(core: CoreProcess) -> None:
    sink = RecordingSink(cancel_after=3)
    core.submit(ENDLESS, "endless", sink)
    sink.wait(30)
    assert sink.error is None and sink.outputs[-1].completion_tokens < 10**8


def test_the_core_reports_its_load(core: CoreProcess) -> None:
    time.sleep(0.8)  # a status every half second
    running, waiting = core.load()
    assert running >= 0 and waiting >= 0


class Asked(RecordingSink):
    """Counts the cancellation checks made of it after it was refused (Triton crashes on one)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = False
        self.asked_after = 0

    def is_cancelled(self) -> bool:
        self.asked_after += self.refused
        return False


def test_a_core_that_dies_fails_its_requests_and_is_replaced() -> None:
    core = CoreProcess(SYNTHETIC, ResponsePump())
    try:
        first = core.pid
        assert first is not None
        sink = RecordingSink()
        core.submit(ENDLESS, "doomed", sink)
        deadline = time.monotonic() + 30
        while not sink.outputs and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(first, signal.SIGKILL)
        sink.wait(30)
        assert isinstance(sink.error, Unavailable) and "engine process exited" in str(sink.error)
        deadline = time.monotonic() + 60
        while True:  # the new core takes a moment to start; meanwhile requests are refused (503)
            after = Asked()
            try:
                core.submit(GenerationRequest(prompt="x", max_tokens=3), "after", after)
                break
            except Unavailable:
                after.refused = True
                time.sleep(0.1)  # ten of the pump's cancellation passes: none may ask a refused request
                assert after.asked_after == 0
                assert time.monotonic() < deadline
        after.wait(30)
        assert after.error is None and after.text == " token" * 3
        assert core.pid != first
    finally:
        core.shutdown()


def test_a_stuck_core_is_noticed_its_requests_fail_and_it_is_replaced() -> None:
    """Stopped, not dead: the health check says so within seconds, and the core is killed and replaced."""
    core = CoreProcess(SYNTHETIC, ResponsePump(), stuck_after_s=4.0)
    try:
        first = core.pid
        assert first is not None
        core.health()
        sink = RecordingSink()
        core.submit(ENDLESS, "doomed", sink)
        deadline = time.monotonic() + 30
        while not sink.outputs and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(first, signal.SIGSTOP)
        stopped = time.monotonic()
        # Silent past the healthy limit, not yet past the stuck one. (Polled: under load the stub may
        # still be reading what the core sent before it stopped, which counts as hearing from it.)
        silent = None
        while silent is None and time.monotonic() - stopped < 3.8:
            try:
                core.health()
                time.sleep(0.05)
            except Unavailable as exc:
                silent = str(exc)
        assert silent is not None and "has not reported" in silent
        sink.wait(30)
        assert isinstance(sink.error, Unavailable)
        deadline = time.monotonic() + 60
        while True:
            try:
                core.health()
                break
            except Unavailable:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert core.pid != first
        after = RecordingSink()
        core.submit(GenerationRequest(prompt="x", max_tokens=3), "after", after)
        after.wait(30)
        assert after.error is None and after.text == " token" * 3
    finally:
        core.shutdown()


def test_the_core_exits_when_the_stub_goes_away() -> None:
    parent, child = multiprocessing.Pipe()
    core = threading.Thread(target=run_core, args=(SYNTHETIC, child), daemon=True)
    core.start()
    assert parent.poll(30) and parent.recv().pid == os.getpid()  # ready
    parent.close()  # as when the stub dies: its end of the pipe closes
    core.join(30)
    assert not core.is_alive()


def _served(core: CoreProcess, name: str, tokens: int = 5) -> RecordingSink:
    sink = RecordingSink()
    core.submit(GenerationRequest(prompt="a b", max_tokens=tokens, stream=True), name, sink)
    sink.wait(30)
    return sink


def _core_serves(core: CoreProcess, name: str) -> bool:
    """Whether ``core`` serves a request, waiting out a restart (refused with 503 meanwhile)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            sink = _served(core, name)
        except Unavailable:
            time.sleep(0.1)
            continue
        if sink.error is None:
            return sink.text == " token" * 5
        time.sleep(0.1)
    return False


def test_instances_given_one_rendezvous_share_one_engine_process(tmp_path: Path) -> None:
    rendezvous = CoreRendezvous(socket=tmp_path / "core.sock", lock=tmp_path / "core.lock")
    leader = CoreProcess(SYNTHETIC, ResponsePump(), rendezvous=rendezvous)
    joined = CoreProcess(SYNTHETIC, ResponsePump(), rendezvous=rendezvous)
    try:
        assert joined.pid == leader.pid
        assert leader.reports_engine and not joined.reports_engine
        sinks = {index: RecordingSink() for index in range(6)}  # interleaved over both instances
        for index, sink in sinks.items():
            (leader if index % 2 else joined).submit(GenerationRequest(prompt="a", max_tokens=20), f"r{index}", sink)
        for sink in sinks.values():
            sink.wait(30)
            assert sink.error is None and sink.text == " token" * 20
        joined.health()
        cancelled = RecordingSink(cancel_after=3)
        joined.submit(ENDLESS, "endless", cancelled)
        cancelled.wait(30)
        assert cancelled.error is None and cancelled.outputs[-1].completion_tokens < 10**8
        joined.shutdown()  # an instance that goes away leaves the engine to the others
        assert _served(leader, "after").text == " token" * 5
    finally:
        joined.shutdown()
        leader.shutdown()


def test_a_shared_engine_that_dies_is_replaced_for_every_instance_and_outlives_its_leader(tmp_path: Path) -> None:
    rendezvous = CoreRendezvous(socket=tmp_path / "core.sock", lock=tmp_path / "core.lock")
    leader = CoreProcess(SYNTHETIC, ResponsePump(), rendezvous=rendezvous)
    joined = CoreProcess(SYNTHETIC, ResponsePump(), rendezvous=rendezvous)
    try:
        first = leader.pid
        assert first is not None
        doomed = RecordingSink()
        joined.submit(ENDLESS, "doomed", doomed)
        os.kill(first, signal.SIGKILL)
        doomed.wait(30)
        assert isinstance(doomed.error, Unavailable)
        assert _core_serves(joined, "joined-after") and _core_serves(leader, "leader-after")
        assert joined.pid == leader.pid != first
        second = leader.pid
        leader.shutdown()  # its engine process stops with it; the joined instance starts the next one
        assert _core_serves(joined, "alone")
        assert joined.reports_engine and joined.pid not in (first, second)
    finally:
        leader.shutdown()
        joined.shutdown()
