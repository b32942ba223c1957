"""Faults under a running ``llgtriton serve``: tritonserver dies, the model's stub dies, the engine's
own process dies.

Each time the proxy keeps running: it answers 503 (``/ready`` and generation) while Triton (or the
engine process) is restarted, requests in flight end with an error instead of hanging, and it
serves again once the model is back, with no restart of the proxy. The server runs its engine in a
process of its own (``--engine-core-process on``, the default with CUDA), so that process's
faults are covered too, and its constraints' matchers in a mask process (``--engine-mask-process
on``, the default with CUDA too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from launcher.triton_server import STUB_NAME, live_children
from tests.support.harness import RunningServer, start_process, start_server, stop_server, triton_ports_argv

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
RECOVERY_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("faults") / "serve.log",
        "--engine-core-process=on",
        "--engine-mask-process=on",
        "--engine-mask-processes=1",  # one child, whatever the cores (several: tests/backend/test_mask_process.py)
    )
    yield running
    stop_server(running)


def _tritonserver(server: RunningServer) -> int:
    (pid,) = live_children(server.process.pid, "tritonserver")
    return pid


def _stubs(server: RunningServer) -> list[int]:
    return live_children(_tritonserver(server), STUB_NAME)


def _cores(server: RunningServer) -> list[int]:
    """The engine processes: one child of each stub."""
    return [pid for stub in _stubs(server) for pid in live_children(stub, "spawn_main")]


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _status(url: str) -> int:
    return httpx.get(url, timeout=5).status_code


def _completes(server: RunningServer) -> bool:
    try:
        with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0, timeout=60) as client:
            response = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
            )
    except openai.APIStatusError as exc:
        assert exc.status_code == 503, f"while Triton restarts, requests get 503, not {exc.status_code}"
        assert exc.response.headers.get("retry-after")
        return False
    return response.choices[0].finish_reason is not None


def _wait_until_serving(server: RunningServer) -> float:
    """Seconds until a request completes again; fails the test past RECOVERY_TIMEOUT_S."""
    started = time.monotonic()
    while not _completes(server):
        assert server.process.poll() is None, f"llgtriton serve exited:\n{server.log_tail()}"
        assert time.monotonic() - started < RECOVERY_TIMEOUT_S, f"not serving again:\n{server.log_tail()}"
        time.sleep(1)
    return time.monotonic() - started


def test_proxy_reports_not_ready_while_triton_restarts_then_serves_again(own_server: RunningServer) -> None:
    ready_url = f"http://127.0.0.1:{own_server.proxy_port}/ready"
    assert _status(ready_url) == 200
    old_triton = _tritonserver(own_server)
    old_stubs = _stubs(own_server)

    os.kill(old_triton, signal.SIGKILL)  # the server alone: its stub lives on until the launcher kills it
    deadline = time.monotonic() + 10
    while _status(ready_url) == 200:
        assert time.monotonic() < deadline, "/ready still says ready 10 s after Triton died"
        time.sleep(0.2)
    assert _status(ready_url) == 503
    assert _status(f"http://127.0.0.1:{own_server.proxy_port}/health") == 200  # alive, just not ready

    _wait_until_serving(own_server)
    assert _status(ready_url) == 200
    assert _tritonserver(own_server) != old_triton
    assert "restarting tritonserver (1 of at most 3)" in own_server.log.read_text()
    assert old_stubs and not [pid for pid in old_stubs if _running(pid)], "the dead server's stub still runs"


def test_stub_crash_ends_requests_in_flight_with_an_error_then_serves_again(
    own_server: RunningServer, request: pytest.FixtureRequest
) -> None:
    client = openai.OpenAI(base_url=own_server.openai_base_url, api_key="unused", max_retries=0, timeout=120)
    first_chunk = threading.Event()
    outcome: list[str] = []

    def stream_a_long_story() -> None:
        try:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Tell me a very long story."}],
                max_tokens=500,
                stream=True,
            )
            for _ in stream:
                first_chunk.set()
            outcome.append("finished")
        except openai.APIError as exc:
            outcome.append(f"error: {exc}")
        finally:
            first_chunk.set()

    streaming = threading.Thread(target=stream_a_long_story)
    streaming.start()
    request.addfinalizer(client.close)  # (its stream is cut when the stub dies: closed here, not by the GC)
    assert first_chunk.wait(60)
    old_stubs = _stubs(own_server)
    old_cores = _cores(own_server)
    assert old_stubs and old_cores
    killed = time.monotonic()
    for pid in old_stubs:
        os.kill(pid, signal.SIGKILL)

    streaming.join(60)
    assert not streaming.is_alive(), "the request in flight hung after its stub died"
    ended_after = time.monotonic() - killed
    assert outcome and outcome[0].startswith("error"), outcome
    assert ended_after < 30

    _wait_until_serving(own_server)
    assert not set(_stubs(own_server)) & set(old_stubs)
    assert not [pid for pid in old_cores if _running(pid)], "the dead stub's engine process still runs"
    assert "python backend stub" in own_server.log.read_text()


def _a_long_story_begun(client: openai.OpenAI) -> Iterator[object]:
    """A streamed 500-token answer whose first chunk has arrived: the rest of its chunks."""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a very long story."}], max_tokens=500, stream=True
    )
    chunks = iter(stream)
    next(chunks)
    return chunks


def test_a_dead_engine_process_ends_its_requests_and_is_replaced_by_its_stub(own_server: RunningServer) -> None:
    """The stub starts another engine process; Triton and the stub carry on."""
    stubs, (core,) = _stubs(own_server), _cores(own_server)
    with openai.OpenAI(base_url=own_server.openai_base_url, api_key="unused", max_retries=0, timeout=120) as client:
        chunks = _a_long_story_begun(client)
        os.kill(core, signal.SIGKILL)
        with pytest.raises(openai.APIError, match="engine process exited"):
            for _ in chunks:
                pass
    _wait_until_serving(own_server)
    assert _stubs(own_server) == stubs
    assert _cores(own_server) and core not in _cores(own_server)
    assert "the engine process exited (code -9); restarting it" in own_server.log.read_text()
    deadline = time.monotonic() + 30
    while [pid for pid in _mask_processes_anywhere() if pid not in _mask_processes(own_server)]:
        assert time.monotonic() < deadline, "the dead engine process's mask process outlived it"
        time.sleep(0.2)


def test_a_stuck_engine_process_is_noticed_its_requests_fail_and_it_is_replaced(own_server: RunningServer) -> None:
    """Stopped, not dead: /ready says so within seconds, and the stub kills and replaces it."""
    (core,) = _cores(own_server)
    ready_url = f"http://127.0.0.1:{own_server.proxy_port}/ready"
    with openai.OpenAI(base_url=own_server.openai_base_url, api_key="unused", max_retries=0, timeout=120) as client:
        chunks = _a_long_story_begun(client)
        os.kill(core, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 15
            while _status(ready_url) == 200:
                assert time.monotonic() < deadline, "/ready still says ready 15 s after the engine stopped"
                time.sleep(0.2)
            with pytest.raises(openai.APIError, match="engine process"):
                for _ in chunks:
                    pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(core, signal.SIGCONT)
    _wait_until_serving(own_server)
    assert core not in _cores(own_server)
    assert "sent nothing for 10 s; killing it" in own_server.log.read_text()


def _mask_processes_anywhere() -> list[int]:
    """Every running mask process on this machine (an orphan's parent is no longer an engine process)."""
    return [pid for pid in _all_pids() if _running(pid) and b"backend.mask_child" in _command_line(pid)]


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _command_line(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _mask_processes(server: RunningServer) -> list[int]:
    """The engine processes' mask processes: one child of each."""
    return [pid for core in _cores(server) for pid in live_children(core, "backend.mask_child")]


def _constrained(client: openai.OpenAI, regex: str, max_tokens: int) -> Iterator[Any]:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"guided_regex": regex},
    )
    return iter(stream)


def test_a_dead_mask_process_ends_only_its_requests_and_another_starts(own_server: RunningServer) -> None:
    """Its constrained stream ends with an error, a free one beside it goes on, and constraints are
    served again by another mask process: the engine process and Triton carry on."""
    _wait_until_serving(own_server)
    cores = _cores(own_server)
    (mask,) = _mask_processes(own_server)
    with openai.OpenAI(base_url=own_server.openai_base_url, api_key="unused", max_retries=0, timeout=120) as client:
        constrained = _constrained(client, "[a-z ]{3000}", 500)
        next(constrained)
        free = iter(
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=48, stream=True
            )
        )
        next(free)
        os.kill(mask, signal.SIGKILL)
        with pytest.raises(openai.APIError, match="mask process exited"):
            for _ in constrained:
                pass
        ending = [chunk for chunk in free][-1].choices[0].finish_reason
        assert ending in {"stop", "length"}  # (no error: it ran on without a constraint)
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while _mask_processes(own_server) in ([], [mask]):
            assert time.monotonic() < deadline, f"no other mask process:\n{own_server.log_tail()}"
            time.sleep(0.5)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in _constrained(client, "(yes|no)!", 8))
    assert text in {"yes!", "no!"}
    assert _cores(own_server) == cores


def _proxy_workers(server: RunningServer) -> list[int]:
    return live_children(server.process.pid, "spawn_main")


def test_a_dead_proxy_is_replaced_and_the_supervisor_and_triton_carry_on(own_server: RunningServer) -> None:
    """The proxy runs apart from the supervisor: a crash of it (a request's, say) takes nothing else down."""
    (worker,) = _proxy_workers(own_server)
    triton = _tritonserver(own_server)
    os.kill(worker, signal.SIGKILL)
    _wait_until_serving(own_server)
    assert _proxy_workers(own_server) != [worker]
    assert _tritonserver(own_server) == triton
    assert "exited with -9; starting another" in own_server.log.read_text()


def test_stopping_drains_the_streams_in_flight_then_exits_cleanly(
    own_server: RunningServer, request: pytest.FixtureRequest
) -> None:
    """Ctrl-C lets a running stream finish (within ``--proxy-drain-timeout-s``) before Triton stops."""
    client = openai.OpenAI(base_url=own_server.openai_base_url, api_key="unused", max_retries=0, timeout=120)
    request.addfinalizer(client.close)  # (the server stops under it: closed here, not by the garbage collector)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a long essay about the history of Rome."}],
        max_tokens=64,
        temperature=0,
        stream=True,
    )
    chunks = iter(stream)
    assert next(chunks).choices
    own_server.process.send_signal(signal.SIGINT)
    after_stop = [chunk.choices[0] for chunk in chunks if chunk.choices]
    assert len(after_stop) >= 10, "the stream ended right after the signal"
    assert after_stop[-1].finish_reason == "length", "the stream was cut instead of drained"
    assert own_server.process.wait(60) in (0, 130)  # 130: uvicorn re-raises the SIGINT it handled
    assert "stopping tritonserver" in own_server.log.read_text()


def test_serve_log_shows_no_unexpected_tracebacks(own_server: RunningServer) -> None:
    log = Path(own_server.log).read_text()
    assert "Traceback" not in log, own_server.log_tail(80)


def test_a_server_killed_outright_leaves_nothing_that_stops_the_next_one(tmp_path: Path) -> None:
    """SIGKILL of the launcher orphans tritonserver (holding the ports) and its stub; the next start reaps them."""
    first = start_server(tmp_path / "first.log")
    orphan = _tritonserver(first)
    orphan_stubs = _stubs(first)
    (worker,) = _proxy_workers(first)
    os.kill(first.process.pid, signal.SIGKILL)
    first.process.wait()
    assert _running(orphan)
    deadline = time.monotonic() + 30
    while _running(worker):  # the proxy worker sees its supervisor gone and stops by itself
        assert time.monotonic() < deadline, "the orphaned proxy worker kept running"
        time.sleep(0.2)
    argv = [
        "serve",
        f"--proxy-port={first.proxy_port}",
        f"--proxy-triton-url=127.0.0.1:{first.grpc_port}",
        *triton_ports_argv(first.http_port, first.grpc_port, first.metrics_port),
    ]
    log = tmp_path / "second.log"
    second = dataclasses.replace(
        first, process=start_process(log, argv, f"http://127.0.0.1:{first.proxy_port}/ready"), log=log
    )
    try:
        assert not _running(orphan) and not [pid for pid in orphan_stubs if _running(pid)]
        assert "an earlier server left behind" in second.log.read_text()
        _wait_until_serving(second)
    finally:
        stop_server(second)
