"""Stored Responses API responses on PostgreSQL, so proxies on several hosts share conversations.

The same contract as :class:`~proxy.responses.store.SQLiteResponseStore` (the tests run both): the
TTL, the size bound and each API key's share of it. Writes that prune, evict and upsert hold one
transaction-scoped advisory lock, so two proxies never evict for the same bytes twice; reads take no
lock. The schema is created, or checked, at start under that lock. Connections come from a pool
opened on first use, through psycopg 3's async driver.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from proxy.errors import StoreUnavailableError
from proxy.responses.store import ACTIVE, SCHEMA_VERSION, StoredResponse

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Connection = psycopg.AsyncConnection[DictRow]

# Any constant, the same in every proxy: pg_advisory_xact_lock(_WRITE_LOCK) serialises the writers.
_WRITE_LOCK = 0x6C6C_6774_7274
CONNECT_TIMEOUT_S = 5
POOL_SIZE = 8

# A streamed background response's events, for readers on any proxy; they count towards its size.
_EVENTS_SCHEMA = """CREATE TABLE IF NOT EXISTS llgtriton_response_events (
    response_id TEXT NOT NULL REFERENCES llgtriton_responses (id) ON DELETE CASCADE,
    sequence_number INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (response_id, sequence_number)
)"""

_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS llgtriton_responses (
        seq BIGSERIAL PRIMARY KEY,  -- insertion order: the tie-break among equal created_at when evicting
        id TEXT NOT NULL UNIQUE,
        owner TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL,
        size BIGINT NOT NULL,
        response TEXT NOT NULL,
        input_items TEXT NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL DEFAULT 0  -- last word from the proxy running it
    )""",
    "CREATE INDEX IF NOT EXISTS llgtriton_responses_expires_at ON llgtriton_responses (expires_at)",
    "CREATE INDEX IF NOT EXISTS llgtriton_responses_created_at ON llgtriton_responses (created_at, seq)",
    _EVENTS_SCHEMA,
    "CREATE TABLE IF NOT EXISTS llgtriton_schema (version INTEGER NOT NULL)",
]


def display_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))  # ASCII: characters are bytes, as in the SQLite store


def _stored(row: dict[str, Any]) -> StoredResponse:
    return StoredResponse(
        id=row["id"],
        owner=row["owner"],
        created_at=int(row["created_at"]),
        status=row["status"],
        response=json.loads(row["response"]),
        input_items=json.loads(row["input_items"]),
        heartbeat_at=float(row["heartbeat_at"]),
    )


def _migrate(connection: psycopg.Connection[Any], url: str) -> None:
    """Create the schema if it is missing (under the write lock), then check its version. A database
    that holds it already is only read, so a read-only one still serves reads."""
    with connection.transaction():
        if connection.execute("SELECT to_regclass('llgtriton_schema')").fetchone() == (None,):
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            for statement in _SCHEMA:
                connection.execute(statement)
        row = connection.execute("SELECT version FROM llgtriton_schema").fetchone()
        if row is None:
            connection.execute("INSERT INTO llgtriton_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
        elif row[0] > SCHEMA_VERSION:
            raise StoreUnavailableError(
                f"the Responses store {display_url(url)} has schema {row[0]}, newer than this server's"
            )
        elif row[0] < SCHEMA_VERSION:  # (version 1 had no heartbeat_at, 2 no event logs)
            connection.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))
            connection.execute(
                "ALTER TABLE llgtriton_responses"
                " ADD COLUMN IF NOT EXISTS heartbeat_at DOUBLE PRECISION NOT NULL DEFAULT 0"
            )
            connection.execute(_EVENTS_SCHEMA)
            connection.execute("UPDATE llgtriton_schema SET version = %s", (SCHEMA_VERSION,))


class PostgresResponseStore:
    """A :class:`~proxy.responses.store.ResponseStore` in a PostgreSQL database given by URL."""

    def __init__(self, url: str, *, ttl_s: float, max_bytes: int, owners: int = 1) -> None:
        self._url = url
        self._name = display_url(url)
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._share = max_bytes // max(1, owners)
        self._pool: AsyncConnectionPool[_Connection] | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def check(cls, url: str) -> None:
        """Connect once, creating or checking the schema: at start-up, so an unusable database stops the
        server naming it. Raises :class:`StoreUnavailableError`."""
        try:
            with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as connection:
                _migrate(connection, url)
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"the Responses store {display_url(url)} cannot be opened: {exc}") from None

    async def _connected(self) -> AsyncConnectionPool[_Connection]:
        async with self._opening:
            if self._pool is None:
                pool = AsyncConnectionPool(
                    self._url,
                    connection_class=_Connection,
                    min_size=1,
                    max_size=POOL_SIZE,
                    open=False,
                    timeout=CONNECT_TIMEOUT_S,
                    kwargs={"autocommit": True, "row_factory": dict_row, "connect_timeout": CONNECT_TIMEOUT_S},
                    name="llgtriton-responses",
                )
                await asyncio.to_thread(self.check, self._url)  # the schema, if no start-up check made it
                await pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
                self._pool = pool
            return self._pool

    async def _run(self, work: Callable[[_Connection], Awaitable[_T]]) -> _T:
        """``work`` on a pooled connection; the database failing is a 503 naming it, never an internal error."""
        try:
            pool = await self._connected()
            async with pool.connection() as connection:
                return await work(connection)
        except (psycopg.Error, PoolTimeout, OSError) as exc:
            logger.error("the Responses store %s failed: %s", self._name, exc)
            raise StoreUnavailableError(f"the Responses store {self._name} failed: {exc}") from None

    # Within a transaction holding the write lock.

    async def _lock(self, connection: _Connection) -> None:
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (_WRITE_LOCK,))

    async def _select(self, connection: _Connection, response_id: str, owner: str, now: float) -> dict[str, Any] | None:
        cursor = await connection.execute(
            "SELECT * FROM llgtriton_responses WHERE id = %s AND owner = %s AND expires_at > %s",
            (response_id, owner, now),
        )
        return await cursor.fetchone()

    async def _write(self, connection: _Connection, stored: StoredResponse) -> None:
        """Prune, evict the oldest until it fits, then upsert."""
        now = time.time()
        response, input_items = _dumps(stored.response), _dumps(stored.input_items)
        cursor = await connection.execute(
            "SELECT COALESCE(SUM(LENGTH(event)), 0) AS logged FROM llgtriton_response_events WHERE response_id = %s",
            (stored.id,),
        )
        logged = await cursor.fetchone()
        size = len(response) + len(input_items) + (int(logged["logged"]) if logged is not None else 0)
        if size > self._share:
            raise ValueError(f"the response and its input take {size} bytes, more than a key's {self._share}")
        await connection.execute("DELETE FROM llgtriton_responses WHERE expires_at <= %s", (now,))
        await self._evict(connection, "owner = %s AND id != %s", (stored.owner, stored.id), self._share - size)
        await self._evict(connection, "id != %s", (stored.id,), self._max_bytes - size)
        # A replace keeps the first write's expiry and position, as in the SQLite store.
        await connection.execute(
            """INSERT INTO llgtriton_responses
                (id, owner, created_at, expires_at, status, size, response, input_items, heartbeat_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, created_at = excluded.created_at,
                status = excluded.status, size = excluded.size, response = excluded.response,
                input_items = excluded.input_items, heartbeat_at = excluded.heartbeat_at""",
            (
                *(stored.id, stored.owner, stored.created_at, now + self._ttl_s, stored.status, size),
                *(response, input_items, now),
            ),
        )

    async def _evict(self, connection: _Connection, where: str, parameters: tuple[str, ...], room: int) -> None:
        cursor = await connection.execute(
            f"SELECT COALESCE(SUM(size), 0) AS used FROM llgtriton_responses WHERE {where}", parameters
        )
        row = await cursor.fetchone()
        used = int(row["used"]) if row is not None else 0
        if used <= room:
            return
        cursor = await connection.execute(
            f"SELECT seq, size FROM llgtriton_responses WHERE {where} ORDER BY created_at, seq", parameters
        )
        evicted = []
        async for candidate in cursor:
            if used <= room:
                break
            evicted.append(candidate["seq"])
            used -= int(candidate["size"])
        await connection.execute("DELETE FROM llgtriton_responses WHERE seq = ANY(%s)", (evicted,))
        logger.info("evicted the %d oldest stored responses to stay within %d bytes", len(evicted), room)

    # The public interface.

    async def put(self, stored: StoredResponse) -> None:
        async def work(connection: _Connection) -> None:
            async with connection.transaction():
                await self._lock(connection)
                await self._write(connection, stored)

        await self._run(work)

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        async def work(connection: _Connection) -> StoredResponse | None:
            row = await self._select(connection, response_id, owner, time.time())
            return None if row is None else _stored(row)

        return await self._run(work)

    async def status(self, response_id: str, owner: str) -> str | None:
        return await self._run(lambda connection: self._status_of(connection, response_id, owner))

    async def delete(self, response_id: str, owner: str) -> bool:
        async def work(connection: _Connection) -> bool:
            cursor = await connection.execute(
                "DELETE FROM llgtriton_responses WHERE id = %s AND owner = %s AND expires_at > %s",
                (response_id, owner, time.time()),
            )
            return cursor.rowcount > 0

        return await self._run(work)

    async def finish(self, stored: StoredResponse) -> bool:
        async def work(connection: _Connection) -> bool:
            async with connection.transaction():  # a cancel from another proxy cannot slip in between
                await self._lock(connection)
                row = await self._select(connection, stored.id, stored.owner, time.time())
                if row is None or row["status"] not in ACTIVE:
                    return False
                await self._write(connection, stored)
                return True

        return await self._run(work)

    async def cancel(self, response_id: str, owner: str, response: dict[str, Any]) -> StoredResponse | None:
        async def work(connection: _Connection) -> StoredResponse | None:
            async with connection.transaction():
                await self._lock(connection)
                row = await self._select(connection, response_id, owner, time.time())
                if row is None:
                    return None
                current = _stored(row)
                if current.status not in ACTIVE:
                    return current
                cancelled = replace(current, status="cancelled", response=response)
                await self._write(connection, cancelled)
                return cancelled

        return await self._run(work)

    async def touch(self, response_id: str, owner: str) -> str | None:
        return await self._run(lambda connection: self._touched(connection, response_id, owner))

    async def _touched(self, connection: _Connection, response_id: str, owner: str) -> str | None:
        now = time.time()
        await connection.execute(
            """UPDATE llgtriton_responses SET heartbeat_at = %s
            WHERE id = %s AND owner = %s AND expires_at > %s AND status = ANY(%s)""",
            (now, response_id, owner, now, sorted(ACTIVE)),
        )
        return await self._status_of(connection, response_id, owner)

    async def _status_of(self, connection: _Connection, response_id: str, owner: str) -> str | None:
        cursor = await connection.execute(
            "SELECT status FROM llgtriton_responses WHERE id = %s AND owner = %s AND expires_at > %s",
            (response_id, owner, time.time()),
        )
        row = await cursor.fetchone()
        return None if row is None else str(row["status"])

    async def fail_stale(
        self, response_id: str, owner: str, heard_before: float, response: dict[str, Any]
    ) -> StoredResponse | None:
        async def work(connection: _Connection) -> StoredResponse | None:
            async with connection.transaction():
                await self._lock(connection)
                row = await self._select(connection, response_id, owner, time.time())
                if row is None or row["status"] not in ACTIVE or row["heartbeat_at"] >= heard_before:
                    return None
                stale = replace(_stored(row), status="failed", response=response)
                await self._write(connection, stale)
                return stale

        return await self._run(work)

    async def append_events(self, response_id: str, owner: str, events: list[dict[str, Any]]) -> str | None:
        rows = [(response_id, event["sequence_number"], _dumps(event)) for event in events]

        async def work(connection: _Connection) -> str | None:
            async with connection.transaction():
                if await self._select(connection, response_id, owner, time.time()) is None:
                    return None
                added = 0
                for row in rows:
                    cursor = await connection.execute(
                        "INSERT INTO llgtriton_response_events VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", row
                    )
                    added += cursor.rowcount * len(row[2])
                await connection.execute(
                    "UPDATE llgtriton_responses SET size = size + %s WHERE id = %s", (added, response_id)
                )
            return await self._touched(connection, response_id, owner)

        return await self._run(work)

    async def events(self, response_id: str, owner: str, after: int, limit: int | None = None) -> list[dict[str, Any]]:
        async def work(connection: _Connection) -> list[dict[str, Any]]:
            cursor = await connection.execute(
                """SELECT event FROM llgtriton_response_events JOIN llgtriton_responses ON id = response_id
                WHERE response_id = %s AND owner = %s AND expires_at > %s AND sequence_number > %s
                ORDER BY sequence_number LIMIT %s""",
                (response_id, owner, time.time(), after, limit),
            )
            return [json.loads(row["event"]) async for row in cursor]

        return await self._run(work)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
