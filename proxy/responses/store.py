"""Stored responses of the Responses API (``store``, ``previous_response_id``, background responses).

``SQLiteResponseStore`` keeps them in one SQLite file in WAL mode, so the proxy's worker processes on one host
share it. Several hosts share :class:`~proxy.responses.postgres_store.PostgresResponseStore` instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from proxy.errors import StoreUnavailableError

logger = logging.getLogger(__name__)

ACTIVE = frozenset({"queued", "in_progress"})

SCHEMA_VERSION = 3  # 2: heartbeat_at; 3: response_events
BUSY_TIMEOUT_S = 5.0

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE responses (
    seq INTEGER PRIMARY KEY,  -- insertion order: the tie-break among equal created_at when evicting
    id TEXT NOT NULL UNIQUE,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at REAL NOT NULL,
    status TEXT NOT NULL,
    size INTEGER NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    heartbeat_at REAL NOT NULL DEFAULT 0  -- last word from the proxy running it (every write, and touch)
);
CREATE INDEX responses_expires_at ON responses (expires_at);
CREATE INDEX responses_created_at ON responses (created_at, seq);
"""

# The events of a background response streamed as it runs, so that a reader on any proxy can resume them.
# They count towards their response's size and go with it.
_EVENTS_SCHEMA = """
CREATE TABLE response_events (
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE,
    sequence_number INTEGER NOT NULL,
    event TEXT NOT NULL,
    PRIMARY KEY (response_id, sequence_number)
) WITHOUT ROWID
"""


@dataclass(frozen=True)
class StoredResponse:
    id: str  # "resp_..."
    owner: str  # who may read it: owner_of(the caller's API key)
    created_at: int  # unix seconds
    status: str  # queued, in_progress, completed, incomplete, cancelled, failed
    response: dict[str, Any]  # the Response object, as JSON
    input_items: list[dict[str, Any]]  # the whole input: earlier turns (via previous_response_id), then this request's
    # When the proxy running it last wrote or touched it (unix seconds); set by the store, not compared.
    heartbeat_at: float = field(default=0.0, compare=False)


class ResponseStore(Protocol):
    async def put(self, stored: StoredResponse) -> None:
        """Insert, or replace the record with the same id. ``ValueError`` if it alone exceeds the size bound."""

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """``None`` if absent, expired, or another owner's."""

    async def status(self, response_id: str, owner: str) -> str | None:
        """Its status alone (cheap, whatever its size); ``None`` as for :meth:`get`."""

    async def delete(self, response_id: str, owner: str) -> bool:
        """Whether it existed (and was the owner's)."""

    async def finish(self, stored: StoredResponse) -> bool:
        """Replace only while the stored one is still ACTIVE (one cancelled meanwhile stays cancelled)."""

    async def cancel(self, response_id: str, owner: str, response: dict[str, Any]) -> StoredResponse | None:
        """If ACTIVE: status "cancelled" with ``response``; otherwise the record unchanged; ``None`` if absent."""

    async def touch(self, response_id: str, owner: str) -> str | None:
        """Note that the proxy running it is alive (its heartbeat is now, if ACTIVE); its status, as :meth:`status`."""

    async def fail_stale(
        self, response_id: str, owner: str, heard_before: float, response: dict[str, Any]
    ) -> StoredResponse | None:
        """If ACTIVE and nothing wrote or touched it since ``heard_before`` (unix seconds): status
        "failed" with ``response``, returned; otherwise ``None``."""

    async def append_events(self, response_id: str, owner: str, events: list[dict[str, Any]]) -> str | None:
        """Add to a response's event log (each event has its ``sequence_number``; one already there is
        kept), and note its proxy is alive as :meth:`touch` does; its status, as :meth:`status`."""

    async def events(self, response_id: str, owner: str, after: int, limit: int | None = None) -> list[dict[str, Any]]:
        """The logged events numbered above ``after``, in order, at most ``limit``; [] as for :meth:`get`."""

    async def close(self) -> None: ...


def owner_of(api_key: str | None) -> str:
    """A digest rather than the key: the file then holds no secret. "" when the server has no keys."""
    return "" if api_key is None else hashlib.sha256(api_key.encode()).hexdigest()


def _dumps(value: object) -> str:
    # ASCII escapes: a lone surrogate from a client cannot make the UTF-8 encoding fail.
    return json.dumps(value, separators=(",", ":"))


def _row_to_stored(row: sqlite3.Row) -> StoredResponse:
    return StoredResponse(
        id=row["id"],
        owner=row["owner"],
        created_at=row["created_at"],
        status=row["status"],
        response=json.loads(row["response"]),
        input_items=json.loads(row["input_items"]),
        heartbeat_at=row["heartbeat_at"],
    )


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an exception.

    IMMEDIATE takes the write lock up front, where the busy timeout applies; a deferred transaction that reads
    and then writes can fail at once with SQLITE_BUSY when another process wrote in between (WAL snapshots).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


class SQLiteResponseStore:
    """One connection, used by one thread at a time (the lock) off the event loop (``asyncio.to_thread``)."""

    def __init__(self, path: Path, *, ttl_s: float, max_bytes: int, owners: int = 1) -> None:
        """``owners``: the API keys that share the store; each may fill its share of ``max_bytes``, and
        what it stores beyond that evicts its own oldest responses, never another key's.

        Raises :class:`StoreUnavailableError` naming the file when it cannot be opened."""
        self._path = path
        try:
            self._open(path, ttl_s=ttl_s, max_bytes=max_bytes, owners=owners)
        except (sqlite3.Error, OSError, RuntimeError) as exc:
            raise StoreUnavailableError(f"the Responses store {path} cannot be opened: {exc}") from None

    @classmethod
    def check(cls, path: Path) -> None:
        """Open the store at ``path`` once (creating it if need be) and close it: at start-up, so an
        unusable one stops the server naming it. Raises :class:`StoreUnavailableError`."""
        store = cls(path, ttl_s=1.0, max_bytes=1)
        store._close()

    def _open(self, path: Path, *, ttl_s: float, max_bytes: int, owners: int) -> None:
        self._ttl_s = ttl_s
        self._max_bytes = max_bytes
        self._share = max_bytes // max(1, owners)
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; writes open their own with BEGIN IMMEDIATE.
        self._conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        try:
            self._conn.row_factory = sqlite3.Row
            self._conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            # WAL: readers and the one writer don't block each other across processes; NORMAL is durable
            # against process crashes (only a power loss can drop the last commits), which is enough here.
            mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode != "wal":
                raise RuntimeError(f"{path}: SQLite cannot use WAL journal mode here (got {mode!r})")
            self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute("PRAGMA foreign_keys = ON")  # a response's events go with it
            self._migrate(path)
        except BaseException:
            self._conn.close()
            raise

    def _migrate(self, path: Path) -> None:
        with self._transaction():
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{path}: response store schema {version} is newer than this server's")
            if version == 0:
                # executescript would commit the open transaction; the statements run one by one instead.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
            elif version == 1:  # every response of version 1 counts as unheard of since long ago
                self._conn.execute("ALTER TABLE responses ADD COLUMN heartbeat_at REAL NOT NULL DEFAULT 0")
            if version < 3:
                self._conn.execute(_EVENTS_SCHEMA)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    async def _run(self, work: Callable[[], _T]) -> _T:
        """``work`` off the event loop; the file failing (unreadable, read-only, disk full) is a 503
        naming the store, never an internal error."""

        def locked() -> _T:
            with self._lock:
                return work()

        try:
            return await asyncio.to_thread(locked)
        except (sqlite3.Error, OSError) as exc:
            logger.error("the Responses store %s failed: %s", self._path, exc)
            raise StoreUnavailableError(f"the Responses store {self._path} failed: {exc}") from None

    # The blocking parts, called with the lock held.

    def _select(self, response_id: str, owner: str, now: float) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._conn.execute(
            "SELECT * FROM responses WHERE id = ? AND owner = ? AND expires_at > ?", (response_id, owner, now)
        ).fetchone()
        return row

    def _write(self, stored: StoredResponse, now: float) -> None:
        """Prune, evict the oldest until it fits, then upsert. Inside a transaction."""
        response, input_items = _dumps(stored.response), _dumps(stored.input_items)
        (logged,) = self._conn.execute(
            "SELECT COALESCE(SUM(LENGTH(event)), 0) FROM response_events WHERE response_id = ?", (stored.id,)
        ).fetchone()
        size = len(response) + len(input_items) + logged  # ASCII only (_dumps), so characters are bytes
        if size > self._share:
            raise ValueError(f"the response and its input take {size} bytes, more than a key's {self._share}")
        pruned = self._conn.execute("DELETE FROM responses WHERE expires_at <= ?", (now,)).rowcount
        if pruned:
            logger.debug("pruned %d expired responses", pruned)
        self._evict("owner = ? AND id != ?", (stored.owner, stored.id), self._share - size)
        self._evict("id != ?", (stored.id,), self._max_bytes - size)
        # A replace keeps the first write's expiry and position: a background response finishing late
        # does not live longer, nor become the newest.
        self._conn.execute(
            """INSERT INTO responses
                (id, owner, created_at, expires_at, status, size, response, input_items, heartbeat_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, created_at = excluded.created_at,
                status = excluded.status, size = excluded.size, response = excluded.response,
                input_items = excluded.input_items, heartbeat_at = excluded.heartbeat_at""",
            (
                *(stored.id, stored.owner, stored.created_at, now + self._ttl_s, stored.status, size),
                *(response, input_items, now),
            ),
        )

    def _evict(self, where: str, parameters: tuple[str, ...], room: int) -> None:
        """Delete the oldest records ``where`` says until theirs take at most ``room`` bytes (the record
        being replaced does not count: its bytes go away with the upsert)."""
        (used,) = self._conn.execute(
            f"SELECT COALESCE(SUM(size), 0) FROM responses WHERE {where}", parameters
        ).fetchone()
        if used <= room:
            return
        evicted = []
        for seq, row_size in self._conn.execute(
            f"SELECT seq, size FROM responses WHERE {where} ORDER BY created_at, seq", parameters
        ):
            if used <= room:
                break
            evicted.append((seq,))
            used -= row_size
        self._conn.executemany("DELETE FROM responses WHERE seq = ?", evicted)
        logger.info("evicted the %d oldest stored responses to stay within %d bytes", len(evicted), room)

    def _put(self, stored: StoredResponse) -> None:
        with self._transaction():
            self._write(stored, time.time())

    def _get(self, response_id: str, owner: str) -> StoredResponse | None:
        row = self._select(response_id, owner, time.time())
        return None if row is None else _row_to_stored(row)

    def _status(self, response_id: str, owner: str) -> str | None:
        row = self._conn.execute(
            "SELECT status FROM responses WHERE id = ? AND owner = ? AND expires_at > ?",
            (response_id, owner, time.time()),
        ).fetchone()
        return None if row is None else str(row[0])

    def _delete(self, response_id: str, owner: str) -> bool:
        with self._transaction():
            cursor = self._conn.execute(
                "DELETE FROM responses WHERE id = ? AND owner = ? AND expires_at > ?", (response_id, owner, time.time())
            )
            return cursor.rowcount > 0

    def _finish(self, stored: StoredResponse) -> bool:
        # Check and write in one IMMEDIATE transaction: a cancel from another process cannot slip in between.
        with self._transaction():
            now = time.time()
            row = self._select(stored.id, stored.owner, now)
            if row is None or row["status"] not in ACTIVE:
                return False
            self._write(stored, now)
            return True

    def _cancel(self, response_id: str, owner: str, response: dict[str, Any]) -> StoredResponse | None:
        with self._transaction():
            now = time.time()
            row = self._select(response_id, owner, now)
            if row is None:
                return None
            current = _row_to_stored(row)
            if current.status not in ACTIVE:
                return current
            cancelled = replace(current, status="cancelled", response=response)
            self._write(cancelled, now)
            return cancelled

    def _touch(self, response_id: str, owner: str) -> str | None:
        now = time.time()
        with self._transaction():
            self._conn.execute(
                """UPDATE responses SET heartbeat_at = ?
                WHERE id = ? AND owner = ? AND expires_at > ? AND status IN (?, ?)""",
                (now, response_id, owner, now, *sorted(ACTIVE)),
            )
            return self._status(response_id, owner)

    def _fail_stale(
        self, response_id: str, owner: str, heard_before: float, response: dict[str, Any]
    ) -> StoredResponse | None:
        with self._transaction():
            now = time.time()
            row = self._select(response_id, owner, now)
            if row is None or row["status"] not in ACTIVE or row["heartbeat_at"] >= heard_before:
                return None
            stale = replace(_row_to_stored(row), status="failed", response=response)
            self._write(stale, now)
            return stale

    def _append_events(self, response_id: str, owner: str, events: list[dict[str, Any]]) -> str | None:
        rows = [(response_id, event["sequence_number"], _dumps(event)) for event in events]
        with self._transaction():
            if self._select(response_id, owner, time.time()) is None:
                return None
            added = 0
            for row in rows:
                added += self._conn.execute(
                    "INSERT INTO response_events VALUES (?, ?, ?) ON CONFLICT DO NOTHING", row
                ).rowcount * len(row[2])
            self._conn.execute("UPDATE responses SET size = size + ? WHERE id = ?", (added, response_id))
        return self._touch(response_id, owner)

    def _events(self, response_id: str, owner: str, after: int, limit: int | None) -> list[dict[str, Any]]:
        if self._select(response_id, owner, time.time()) is None:
            return []
        rows = self._conn.execute(
            """SELECT event FROM response_events WHERE response_id = ? AND sequence_number > ?
            ORDER BY sequence_number LIMIT ?""",
            (response_id, after, -1 if limit is None else limit),
        )
        return [json.loads(event) for (event,) in rows]

    def _close(self) -> None:
        self._conn.close()

    # The public interface.

    async def put(self, stored: StoredResponse) -> None:
        await self._run(lambda: self._put(stored))

    async def get(self, response_id: str, owner: str) -> StoredResponse | None:
        return await self._run(lambda: self._get(response_id, owner))

    async def status(self, response_id: str, owner: str) -> str | None:
        return await self._run(lambda: self._status(response_id, owner))

    async def delete(self, response_id: str, owner: str) -> bool:
        return await self._run(lambda: self._delete(response_id, owner))

    async def finish(self, stored: StoredResponse) -> bool:
        return await self._run(lambda: self._finish(stored))

    async def cancel(self, response_id: str, owner: str, response: dict[str, Any]) -> StoredResponse | None:
        return await self._run(lambda: self._cancel(response_id, owner, response))

    async def touch(self, response_id: str, owner: str) -> str | None:
        return await self._run(lambda: self._touch(response_id, owner))

    async def fail_stale(
        self, response_id: str, owner: str, heard_before: float, response: dict[str, Any]
    ) -> StoredResponse | None:
        return await self._run(lambda: self._fail_stale(response_id, owner, heard_before, response))

    async def append_events(self, response_id: str, owner: str, events: list[dict[str, Any]]) -> str | None:
        return await self._run(lambda: self._append_events(response_id, owner, events))

    async def events(self, response_id: str, owner: str, after: int, limit: int | None = None) -> list[dict[str, Any]]:
        return await self._run(lambda: self._events(response_id, owner, after, limit))

    async def close(self) -> None:
        await self._run(self._close)
