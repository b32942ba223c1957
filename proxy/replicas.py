"""Several Triton servers behind one proxy: least in-flight routing, unhealthy replicas skipped.

:class:`ReplicaPool` is a :class:`GenerationClient` over one client per replica. A request goes to
the healthy replica with the fewest generations in flight (ties rotate, so an idle pool spreads
requests evenly). A replica that answers "unavailable" (connection refused, restarting, queue
full) before its first output is marked down for a while, growing from one second to thirty while
it keeps failing, and the request is retried on the next replica: nothing of it reached the
client yet, so nothing is repeated or lost. Once a replica has produced output, its errors go to
the client as they are. ``/ready`` asks every replica and marks each up or down by the answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass

from llgtriton import wire
from proxy.errors import ServiceUnavailableError
from proxy.metrics import ProxyMetrics
from proxy.triton_client import GenerationClient

logger = logging.getLogger(__name__)

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0


@dataclass(eq=False)
class Replica:
    """One Triton endpoint and what the pool knows of it (owned by the event loop thread)."""

    url: str
    client: GenerationClient
    in_flight: int = 0
    down_until: float = 0.0  # time.monotonic() before which it is skipped while others are up
    failures: int = 0  # consecutive "unavailable" answers

    def is_up(self, now: float) -> bool:
        return now >= self.down_until

    def mark_down(self, now: float) -> None:
        self.failures += 1
        self.down_until = now + min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self.failures - 1))

    def mark_up(self) -> None:
        self.failures = 0
        self.down_until = 0.0


class ReplicaPool:
    def __init__(
        self,
        replicas: Sequence[tuple[str, GenerationClient]],
        metrics: ProxyMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not replicas:
            raise ValueError("a replica pool needs at least one replica")
        self.replicas = [Replica(url, client) for url, client in replicas]
        self._metrics = metrics
        self._clock = clock
        self._rotation = itertools.count()

    def _pick(self, tried: set[Replica]) -> Replica | None:
        """Least in flight among the replicas that are up; when none is, the one back soonest."""
        now = self._clock()
        start = next(self._rotation) % len(self.replicas)
        rotated = self.replicas[start:] + self.replicas[:start]
        candidates = [replica for replica in rotated if replica not in tried]
        if not candidates:
            return None
        up = [replica for replica in candidates if replica.is_up(now)]
        if up:
            return min(up, key=lambda replica: replica.in_flight)
        return min(candidates, key=lambda replica: replica.down_until)

    def _set_in_flight(self, replica: Replica, change: int) -> None:
        replica.in_flight += change
        if self._metrics is not None:
            self._metrics.replica_in_flight.labels(replica.url).set(replica.in_flight)

    async def generate(self, request: wire.GenerationRequest, request_id: str) -> AsyncGenerator[wire.GenerationOutput]:
        tried: set[Replica] = set()
        while (replica := self._pick(tried)) is not None:
            tried.add(replica)
            started = False
            self._set_in_flight(replica, +1)
            try:
                async with aclosing(replica.client.generate(request, request_id)) as outputs:
                    async for output in outputs:
                        started = True
                        yield output
                replica.mark_up()
                return
            except ServiceUnavailableError as exc:
                if started:
                    raise
                replica.mark_down(self._clock())
                if len(tried) == len(self.replicas):
                    raise
                logger.warning(
                    "replica %s unavailable (%s); retrying request %s elsewhere", replica.url, exc, request_id
                )
                if self._metrics is not None:
                    self._metrics.replica_retries.labels(replica.url).inc()
            finally:
                self._set_in_flight(replica, -1)

    async def is_ready(self) -> bool:
        answers = await asyncio.gather(*(replica.client.is_ready() for replica in self.replicas))
        now = self._clock()
        for replica, ready in zip(self.replicas, answers, strict=True):
            if ready:
                replica.mark_up()
            elif replica.is_up(now):
                replica.mark_down(now)
        return any(answers)

    async def close(self) -> None:
        await asyncio.gather(*(replica.client.close() for replica in self.replicas))
