"""The Responses store that ``proxy.responses_store`` names: a SQLite file or a PostgreSQL database."""

from __future__ import annotations

from pathlib import Path

from proxy.responses.postgres_store import PostgresResponseStore
from proxy.responses.store import ResponseStore, SQLiteResponseStore


def open_response_store(location: Path | str, *, ttl_s: float, max_bytes: int, owners: int = 1) -> ResponseStore:
    """The store at ``location``: a path (SQLite) or a ``postgresql://`` URL, as settings give it."""
    if isinstance(location, Path):
        return SQLiteResponseStore(location, ttl_s=ttl_s, max_bytes=max_bytes, owners=owners)
    return PostgresResponseStore(location, ttl_s=ttl_s, max_bytes=max_bytes, owners=owners)


def check_response_store(location: Path | str) -> None:
    """Open the store once at start-up; raises :class:`~proxy.errors.StoreUnavailableError` naming it."""
    if isinstance(location, Path):
        SQLiteResponseStore.check(location)
    else:
        PostgresResponseStore.check(location)
