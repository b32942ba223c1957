"""The Responses API's store: one contract, run against a SQLite file (the proxy's processes on one host share
it) and a real PostgreSQL database (proxies on several hosts share it), then each store's own faults."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from proxy.errors import StoreUnavailableError
from proxy.responses.postgres_store import PostgresResponseStore
from proxy.responses.store import ResponseStore, SQLiteResponseStore, StoredResponse, owner_of
from proxy.responses.store_location import open_response_store
from tests.support.harness import free_port
from tests.support.postgres import PostgresServer, postgres_server

ALICE = owner_of("alice-key")
BOB = owner_of("bob-key")


def record(
    response_id: str = "resp_1",
    *,
    owner: str = ALICE,
    created_at: int = 1_700_000_000,
    status: str = "completed",
    text: str = "hello",
) -> StoredResponse:
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
    }
    return StoredResponse(
        id=response_id,
        owner=owner,
        created_at=created_at,
        status=status,
        response=response,
        input_items=[{"type": "message", "role": "user", "content": "Say hello, ünïcode ✓"}],
    )


def open_store(
    location: Path | str, *, ttl_s: float = 3600.0, max_bytes: int = 1_000_000, owners: int = 1
) -> ResponseStore:
    return open_response_store(location, ttl_s=ttl_s, max_bytes=max_bytes, owners=owners)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "nested" / "responses.db"  # parent folders that don't exist yet


@pytest.fixture
async def store(store_location: Path | str) -> AsyncIterator[ResponseStore]:
    store = open_store(store_location)
    yield store
    await store.close()


def test_owner_of_is_a_digest_of_the_key_and_empty_without_keys() -> None:
    assert owner_of(None) == ""
    assert owner_of("alice-key") == hashlib.sha256(b"alice-key").hexdigest()
    assert owner_of("alice-key") != owner_of("bob-key")


async def test_round_trip(store: ResponseStore) -> None:
    stored = record()
    await store.put(stored)
    assert await store.get("resp_1", ALICE) == stored
    assert await store.get("resp_absent", ALICE) is None


async def test_put_replaces_the_record_with_the_same_id(store: ResponseStore) -> None:
    await store.put(record(status="in_progress", text=""))
    await store.put(record(status="completed", text="done"))
    got = await store.get("resp_1", ALICE)
    assert got == record(status="completed", text="done")


async def test_another_owner_cannot_read_delete_or_cancel(store: ResponseStore) -> None:
    stored = record(status="in_progress")
    await store.put(stored)
    assert await store.get("resp_1", BOB) is None
    assert await store.get("resp_1", "") is None  # nor a server without keys reading a keyed record
    assert await store.delete("resp_1", BOB) is False
    assert await store.cancel("resp_1", BOB, {"status": "cancelled"}) is None
    assert await store.get("resp_1", ALICE) == stored


async def test_delete(store: ResponseStore) -> None:
    await store.put(record("resp_1"))
    await store.put(record("resp_2"))
    assert await store.delete("resp_1", ALICE) is True
    assert await store.get("resp_1", ALICE) is None
    assert await store.delete("resp_1", ALICE) is False
    assert await store.get("resp_2", ALICE) == record("resp_2")


async def test_records_expire_after_the_ttl(store_location: Path | str) -> None:
    store = open_store(store_location, ttl_s=0.3)  # long enough for a loaded machine to read it back in time
    try:
        await store.put(record("resp_1", status="in_progress"))
        assert await store.get("resp_1", ALICE) is not None
        await asyncio.sleep(0.35)
        assert await store.get("resp_1", ALICE) is None
        assert await store.delete("resp_1", ALICE) is False
        assert await store.cancel("resp_1", ALICE, {"status": "cancelled"}) is None
        assert await store.finish(record("resp_1")) is False
        await store.put(record("resp_2"))  # prunes the expired one; the new one lives its own ttl
        assert await store.get("resp_2", ALICE) == record("resp_2")
    finally:
        await store.close()


def size_of(stored: StoredResponse) -> int:
    """What the store counts: the compact JSON of the response and of the input."""
    return sum(len(json.dumps(part, separators=(",", ":"))) for part in (stored.response, stored.input_items))


async def test_the_oldest_records_are_evicted_to_stay_within_max_bytes(store_location: Path | str) -> None:
    a = record("resp_a", created_at=100, text="a" * 300)
    b = record("resp_b", created_at=200, text="b" * 300)
    c = record("resp_c", created_at=300, text="c" * 300)
    store = open_store(store_location, max_bytes=2 * size_of(a) + 10)  # room for two
    try:
        # Put out of order: the oldest by created_at goes first, not the first put.
        await store.put(b)
        await store.put(a)
        await store.put(c)
        assert await store.get("resp_a", ALICE) is None
        assert await store.get("resp_b", ALICE) == b
        assert await store.get("resp_c", ALICE) == c
        # Equal created_at: the first inserted goes first.
        d = record("resp_d", created_at=300, text="d" * 300)
        await store.put(d)
        assert await store.get("resp_b", ALICE) is None
        assert await store.get("resp_c", ALICE) == c
        e = record("resp_e", created_at=400, text="e" * 300)
        await store.put(e)
        assert await store.get("resp_c", ALICE) is None
        assert await store.get("resp_d", ALICE) == d
        assert await store.get("resp_e", ALICE) == e
    finally:
        await store.close()


async def test_replacing_a_record_does_not_evict_others_for_its_own_old_bytes(store_location: Path | str) -> None:
    a = record("resp_a", created_at=100, text="a" * 300)
    b = record("resp_b", created_at=200, status="in_progress", text="b" * 300)
    store = open_store(store_location, max_bytes=2 * size_of(a) + 10)
    try:
        await store.put(a)
        await store.put(b)
        await store.put(record("resp_b", created_at=200, text="B" * 300))  # same size, replaces b
        assert await store.get("resp_a", ALICE) == a
    finally:
        await store.close()


async def test_a_record_larger_than_max_bytes_is_refused(store_location: Path | str) -> None:
    small = record("resp_small")
    big = record("resp_big", text="x" * 2000)
    store = open_store(store_location, max_bytes=1000)
    try:
        await store.put(small)
        with pytest.raises(ValueError, match=rf"{size_of(big)} bytes, more than a key's 1000"):
            await store.put(big)
        assert await store.get("resp_big", ALICE) is None
        assert await store.get("resp_small", ALICE) == small  # nothing evicted for a refused record
    finally:
        await store.close()


async def test_a_key_that_fills_its_share_evicts_only_its_own_responses(store_location: Path | str) -> None:
    mine = [record(f"resp_{i}", created_at=100 + i, text="a" * 300) for i in range(6)]
    theirs = record("resp_bob", created_at=1, text="b" * 300, owner=BOB)
    store = open_store(store_location, max_bytes=4 * size_of(mine[0]) + 10, owners=2)  # a share holds two
    try:
        await store.put(theirs)
        for stored in mine:
            await store.put(stored)
        assert await store.get("resp_bob", BOB) == theirs  # the oldest of all, but another key's
        assert [await store.get(s.id, ALICE) is not None for s in mine] == [False] * 4 + [True] * 2
    finally:
        await store.close()


async def test_a_stored_responses_status_is_read_alone(store: ResponseStore) -> None:
    await store.put(record(status="in_progress"))
    assert await store.status("resp_1", ALICE) == "in_progress"
    assert await store.status("resp_1", BOB) is None and await store.status("resp_none", ALICE) is None


async def test_finish_replaces_an_in_progress_record(store: ResponseStore) -> None:
    await store.put(record(status="in_progress", text=""))
    done = record(status="completed", text="done")
    assert await store.finish(done) is True
    assert await store.get("resp_1", ALICE) == done


async def test_finish_does_not_overwrite_a_cancelled_or_finished_record(store: ResponseStore) -> None:
    await store.put(record("resp_1", status="queued"))
    cancelled = await store.cancel("resp_1", ALICE, {"id": "resp_1", "status": "cancelled"})
    assert cancelled is not None
    assert await store.finish(record("resp_1", status="completed")) is False
    assert await store.get("resp_1", ALICE) == cancelled

    await store.put(record("resp_2", status="failed"))
    assert await store.finish(record("resp_2", status="completed")) is False
    assert await store.get("resp_2", ALICE) == record("resp_2", status="failed")

    assert await store.finish(record("resp_absent")) is False
    assert await store.get("resp_absent", ALICE) is None


async def test_cancel_an_active_record(store: ResponseStore) -> None:
    await store.put(record(status="in_progress", text="partial"))
    response = {"id": "resp_1", "object": "response", "status": "cancelled", "output": []}
    cancelled = await store.cancel("resp_1", ALICE, response)
    assert cancelled is not None
    assert cancelled.status == "cancelled"
    assert cancelled.response == response
    assert cancelled.input_items == record().input_items
    assert await store.get("resp_1", ALICE) == cancelled


async def test_cancel_a_finished_record_leaves_it_unchanged(store: ResponseStore) -> None:
    done = record(status="completed")
    await store.put(done)
    assert await store.cancel("resp_1", ALICE, {"status": "cancelled"}) == done
    assert await store.get("resp_1", ALICE) == done


async def test_an_active_record_unheard_of_for_long_is_failed_once_and_a_touched_one_is_not(
    store: ResponseStore,
) -> None:
    await store.put(record("resp_quiet", status="in_progress"))
    await store.put(record("resp_alive", status="in_progress"))
    await store.put(record("resp_done"))
    await asyncio.sleep(0.05)
    assert await store.touch("resp_alive", ALICE) == "in_progress"
    heard_before = time.time() - 0.02  # after the puts, before the touch
    alive, quiet = await store.get("resp_alive", ALICE), await store.get("resp_quiet", ALICE)
    assert alive is not None and quiet is not None and quiet.heartbeat_at < heard_before < alive.heartbeat_at
    lost = {"id": "resp_quiet", "status": "failed", "error": {"code": "server_error"}}
    failed = await store.fail_stale("resp_quiet", ALICE, heard_before, lost)
    assert failed is not None and failed.status == "failed" and failed.response == lost
    assert await store.get("resp_quiet", ALICE) == failed
    assert await store.fail_stale("resp_quiet", ALICE, heard_before, lost) is None  # once
    assert await store.fail_stale("resp_alive", ALICE, heard_before, lost) is None
    assert await store.fail_stale("resp_done", ALICE, time.time() + 1, lost) is None  # not active
    assert await store.fail_stale("resp_quiet", BOB, time.time() + 1, lost) is None  # another key's
    assert await store.touch("resp_done", ALICE) == "completed" and await store.touch("resp_none", ALICE) is None


def test_a_version_1_sqlite_store_is_migrated_and_its_active_records_count_as_unheard_of(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        conn.executescript(
            """CREATE TABLE responses (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, owner TEXT NOT NULL,
                created_at INTEGER NOT NULL, expires_at REAL NOT NULL, status TEXT NOT NULL, size INTEGER NOT NULL,
                response TEXT NOT NULL, input_items TEXT NOT NULL);
            PRAGMA user_version = 1;"""
        )
        old = record(status="in_progress")
        conn.execute(
            "INSERT INTO responses (id, owner, created_at, expires_at, status, size, response, input_items)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (old.id, old.owner, old.created_at, time.time() + 3600, old.status, 10, json.dumps(old.response), "[]"),
        )
        conn.commit()

    async def read_back() -> StoredResponse | None:
        store = open_store(db_path)
        try:
            return await store.fail_stale(old.id, ALICE, time.time() - 60, {"status": "failed"})
        finally:
            await store.close()

    stale = asyncio.run(read_back())
    assert stale is not None and stale.status == "failed"
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 3


def events(*numbers: int, text: str = "x") -> list[dict[str, Any]]:
    return [{"type": "response.output_text.delta", "sequence_number": n, "delta": text} for n in numbers]


async def test_an_event_log_is_read_in_order_after_a_number_and_only_by_its_owner(store: ResponseStore) -> None:
    await store.put(record(status="in_progress"))
    assert await store.append_events("resp_1", ALICE, events(0, 1)) == "in_progress"
    assert await store.append_events("resp_1", ALICE, events(1, 2, 3, text="again")) == "in_progress"  # 1 is kept
    assert await store.events("resp_1", ALICE, -1) == [*events(0, 1), *events(2, 3, text="again")]
    assert [event["sequence_number"] for event in await store.events("resp_1", ALICE, 1)] == [2, 3]
    assert await store.events("resp_1", ALICE, -1, limit=1) == events(0)
    assert await store.events("resp_1", BOB, -1) == []
    assert await store.append_events("resp_1", BOB, events(4)) is None  # another key's
    assert await store.append_events("resp_none", ALICE, events(0)) is None
    assert len(await store.events("resp_1", ALICE, -1)) == 4


async def test_appending_events_is_a_sign_of_life_and_tells_a_cancel(store: ResponseStore) -> None:
    await store.put(record(status="in_progress"))
    quiet_since = time.time()
    await asyncio.sleep(0.01)
    await store.append_events("resp_1", ALICE, events(0))
    assert await store.fail_stale("resp_1", ALICE, quiet_since, {"status": "failed"}) is None
    await store.cancel("resp_1", ALICE, {"status": "cancelled"})
    assert await store.append_events("resp_1", ALICE, events(1)) == "cancelled"


async def test_a_responses_events_go_with_it_and_count_towards_its_size(store_location: Path | str) -> None:
    a = record("resp_a", created_at=100, status="in_progress")
    b = record("resp_b", created_at=200)
    store = open_store(store_location, max_bytes=2 * size_of(a) + 300)
    try:
        await store.put(a)
        await store.append_events("resp_a", ALICE, events(0, 1, 2, text="y" * 100))
        await store.put(b)  # a's record alone would leave room; with its events it does not
        assert await store.get("resp_a", ALICE) is None and await store.get("resp_b", ALICE) == b
        assert await store.events("resp_a", ALICE, -1) == []
        await store.put(record("resp_c", created_at=300, status="in_progress"))
        await store.append_events("resp_c", ALICE, events(0))
        assert await store.delete("resp_c", ALICE)
        await store.put(record("resp_c", created_at=300, status="in_progress"))  # the same id again: a new log
        assert await store.events("resp_c", ALICE, -1) == []
    finally:
        await store.close()


async def test_records_survive_a_restart(store_location: Path | str) -> None:
    first = open_store(store_location)
    await first.put(record("resp_1"))
    await first.close()
    second = open_store(store_location)
    try:
        assert await second.get("resp_1", ALICE) == record("resp_1")
    finally:
        await second.close()


async def test_two_stores_on_one_location_see_each_others_writes(store_location: Path | str) -> None:
    """Like two proxy processes (on one host, or two on PostgreSQL): one runs a background response, the
    other cancels it."""
    worker_a, worker_b = open_store(store_location), open_store(store_location)
    try:
        await worker_a.put(record("resp_1", status="queued"))
        assert await worker_b.get("resp_1", ALICE) == record("resp_1", status="queued")
        cancelled = await worker_b.cancel("resp_1", ALICE, {"id": "resp_1", "status": "cancelled"})
        assert cancelled is not None
        assert await worker_a.finish(record("resp_1", status="completed")) is False
        assert await worker_a.get("resp_1", ALICE) == cancelled

        # Writes from both at once wait for each other (a lock) instead of failing.
        await asyncio.gather(
            *(worker.put(record(f"resp_{i}_{n}")) for n, worker in enumerate((worker_a, worker_b)) for i in range(20))
        )
        for n in range(2):
            for i in range(20):
                assert await worker_a.get(f"resp_{i}_{n}", ALICE) is not None
    finally:
        await worker_a.close()
        await worker_b.close()


async def test_the_file_is_in_wal_mode_with_a_schema_version(db_path: Path) -> None:
    store = open_store(db_path)
    await store.put(record())
    await store.close()
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] >= 1


def test_a_store_that_cannot_be_opened_is_unavailable_naming_its_file(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    path = tmp_path / "a-file" / "responses.db"
    with pytest.raises(StoreUnavailableError, match=re.escape(str(path))):
        SQLiteResponseStore.check(path)
    with pytest.raises(StoreUnavailableError, match=re.escape(str(path))):
        open_store(path)


async def test_a_store_whose_file_goes_bad_is_unavailable_naming_it_not_an_internal_error(db_path: Path) -> None:
    store = open_store(db_path)
    await store.put(record())
    await store.close()
    db_path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailableError, match=re.escape(str(db_path))):
        bad = open_store(db_path)
        await bad.get("resp_1", ALICE)


# PostgreSQL's own faults, on a server of their own (they stop it).


@pytest.fixture(scope="module")
def stoppable() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def test_a_database_that_cannot_be_reached_stops_the_start_naming_it_without_its_password() -> None:
    url = f"postgresql://llgt:secret@127.0.0.1:{free_port()}/llgt"
    with pytest.raises(
        StoreUnavailableError, match=r"postgresql://llgt@127\.0\.0\.1:\d+/llgt cannot be opened"
    ) as caught:
        PostgresResponseStore.check(url)
    assert "secret" not in str(caught.value)


async def test_a_database_that_stops_is_unavailable_naming_it_and_serves_again_when_back(
    stoppable: PostgresServer,
) -> None:
    url = stoppable.new_database()
    store = open_store(url)
    try:
        await store.put(record())
        stoppable.stop()
        try:
            for attempt in (store.get("resp_1", ALICE), store.put(record("resp_2"))):
                with pytest.raises(StoreUnavailableError, match=re.escape(url)):
                    await attempt
        finally:
            stoppable.start()
        deadline = time.monotonic() + 30
        while True:  # the pool replaces its broken connections
            try:
                assert await store.get("resp_1", ALICE) == record()
                break
            except StoreUnavailableError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
    finally:
        await store.close()


async def test_a_read_only_database_refuses_writes_with_a_503_and_still_reads(stoppable: PostgresServer) -> None:
    url = stoppable.new_database()
    store = open_store(url)
    try:
        await store.put(record())
        with psycopg.connect(stoppable.url(), autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET default_transaction_read_only = on')
        await store.close()
        store = open_store(url)  # new sessions take the setting
        assert await store.get("resp_1", ALICE) == record()
        with pytest.raises(StoreUnavailableError, match="read-only"):
            await store.put(record("resp_2"))
    finally:
        await store.close()
