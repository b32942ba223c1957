"""The replica pool: least in-flight routing, retry of requests never started, down replicas skipped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from llgtriton import wire
from llgtriton.settings import ProxySettings, SettingsError, load_settings, parse_command_line
from proxy.app import triton_client
from proxy.errors import InvalidRequestError, ProxyError, ServiceUnavailableError
from proxy.metrics import ProxyMetrics
from proxy.replicas import MAX_BACKOFF_S, ReplicaPool
from proxy.triton_client import TritonGenerationClient

REQUEST = wire.GenerationRequest(prompt="hi", max_tokens=2)


class FakeReplica:
    """Answers two outputs, or fails before (or after) its first one; can hold a request open."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.served: list[str] = []
        self.fail_before: ProxyError | None = None
        self.fail_after_first: ProxyError | None = None
        self.hold: asyncio.Event | None = None
        self.ready = True
        self.closed = False

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        if self.fail_before is not None:
            raise self.fail_before
        self.served.append(request_id)
        yield wire.GenerationOutput(text=self.name)
        if self.fail_after_first is not None:
            raise self.fail_after_first
        if self.hold is not None:
            await self.hold.wait()
        yield wire.GenerationOutput(text="", finish_reason=wire.FinishReason.LENGTH)

    async def is_ready(self) -> bool:
        return self.ready

    async def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool_of(*names: str, clock: Clock | None = None) -> tuple[ReplicaPool, list[FakeReplica], ProxyMetrics]:
    fakes = [FakeReplica(name) for name in names]
    metrics = ProxyMetrics()
    pool = ReplicaPool([(fake.name, fake) for fake in fakes], metrics, clock=clock or Clock())
    return pool, fakes, metrics


async def texts(pool: ReplicaPool, request_id: str = "r") -> list[str]:
    return [output.text async for output in pool.generate(REQUEST, request_id)]


def metric(metrics: ProxyMetrics, name: str, replica: str) -> float:
    value = metrics.registry.get_sample_value(name, {"replica": replica})
    return 0.0 if value is None else value


async def test_idle_replicas_share_requests_in_turn() -> None:
    pool, (a, b), _ = pool_of("a", "b")
    for index in range(6):
        await texts(pool, f"r{index}")
    assert len(a.served) == 3
    assert len(b.served) == 3


async def test_a_request_goes_to_the_replica_with_fewest_in_flight() -> None:
    pool, (a, _b), metrics = pool_of("a", "b")
    a.hold = asyncio.Event()
    held = [pool.generate(REQUEST, f"held{i}") for i in range(3)]
    firsts = [(await anext(stream)).text for stream in held]
    # Idle: a; then b, which has fewer in flight; then a again (one each: a tie, broken in turn).
    assert firsts == ["a", "b", "a"]
    assert metric(metrics, "llgtriton_proxy_replica_requests_in_flight", "a") == 2
    for index in range(3):  # b has none in flight: everything new goes there while a is busy
        assert await texts(pool, f"next{index}") == ["b", ""]
    a.hold.set()
    for stream in held:
        await stream.aclose()
    assert metric(metrics, "llgtriton_proxy_replica_requests_in_flight", "a") == 0
    assert metric(metrics, "llgtriton_proxy_replica_requests_in_flight", "b") == 0


async def test_a_request_refused_before_it_started_is_retried_on_another_replica() -> None:
    pool, (a, b), metrics = pool_of("a", "b")
    a.fail_before = ServiceUnavailableError("connection refused")
    results = [await texts(pool, f"r{i}") for i in range(4)]
    assert results == [["b", ""]] * 4
    assert len(b.served) == 4
    # a was tried once, then skipped while it is down: one retry, not four.
    assert metric(metrics, "llgtriton_proxy_replica_retries_total", "a") == 1


async def test_a_down_replica_is_tried_again_after_its_backoff() -> None:
    clock = Clock()
    pool, (a, _b), _ = pool_of("a", "b", clock=clock)
    a.fail_before = ServiceUnavailableError("restarting")
    await texts(pool, "first")
    a.fail_before = None
    for index in range(4):
        await texts(pool, f"while-down{index}")
    assert a.served == []
    clock.now += MAX_BACKOFF_S
    for index in range(4):
        await texts(pool, f"after{index}")
    assert len(a.served) == 2


async def test_an_error_after_the_first_output_is_not_retried() -> None:
    pool, (a, b), _ = pool_of("a", "b")
    a.fail_after_first = b.fail_after_first = ServiceUnavailableError("replica died mid-stream")
    outputs: list[str] = []
    with pytest.raises(ServiceUnavailableError):
        async for output in pool.generate(REQUEST, "r"):
            outputs.append(output.text)
    assert len(outputs) == 1  # the client saw one output; it is not repeated from another replica
    assert len(a.served) + len(b.served) == 1


async def test_an_invalid_request_is_not_retried() -> None:
    pool, (a, b), _ = pool_of("a", "b")
    a.fail_before = b.fail_before = InvalidRequestError("bad grammar")
    with pytest.raises(InvalidRequestError):
        await texts(pool)
    assert a.served == b.served == []
    assert all(replica.is_up(0.0) or replica.failures == 0 for replica in pool.replicas)


async def test_when_every_replica_refuses_the_client_gets_unavailable() -> None:
    pool, fakes, metrics = pool_of("a", "b", "c")
    for fake in fakes:
        fake.fail_before = ServiceUnavailableError(f"{fake.name} is down")
    with pytest.raises(ServiceUnavailableError):
        await texts(pool)
    assert sum(metric(metrics, "llgtriton_proxy_replica_retries_total", fake.name) for fake in fakes) == 2
    fakes[1].fail_before = None  # every replica is down now; the first to recover serves again at once
    assert await texts(pool, "again") == ["b", ""]


async def test_ready_when_any_replica_is_ready_and_unready_ones_are_skipped() -> None:
    pool, (a, b), _ = pool_of("a", "b")
    a.ready = False
    assert await pool.is_ready()
    for index in range(3):
        await texts(pool, f"r{index}")
    assert a.served == []
    b.ready = False
    assert not await pool.is_ready()
    await pool.close()
    assert a.closed and b.closed


async def test_several_comma_separated_urls_make_a_pool() -> None:
    settings = ProxySettings(triton_url="triton-0:8001, triton-1:8001")
    assert settings.triton_urls == ("triton-0:8001", "triton-1:8001")
    client = triton_client(settings, ProxyMetrics())
    assert isinstance(client, ReplicaPool)
    assert [replica.url for replica in client.replicas] == ["triton-0:8001", "triton-1:8001"]
    single = triton_client(ProxySettings(), ProxyMetrics())
    assert isinstance(single, TritonGenerationClient)
    await client.close()
    await single.close()


@pytest.mark.parametrize("url", ["", "triton", "a:8001,", "a:8001,,b:8001", "a:b"])
def test_a_malformed_replica_list_is_refused(url: str) -> None:
    with pytest.raises(SettingsError, match="triton_url"):
        load_settings(parse_command_line(["--proxy-triton-url", url]), {})
