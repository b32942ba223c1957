"""Shared fixtures: the real model loaded in-process, and a real llgtriton server (Triton + proxy).

The tests mirror the packages (``proxy/``, ``backend/``, ``llgtriton/``, ``launcher/``, ``bench/``);
``e2e/`` runs the whole server, ``gpu/`` runs on the GPU machine, ``clients/`` in its own venv.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llgtriton.settings import EngineSettings
from tests.support.harness import RunningServer, start_server, stop_server
from tests.support.postgres import PostgresServer, postgres_server

# The client suite runs in its own venv, from tests/e2e/test_clients.py: not collected here.
collect_ignore = ["clients"]


@pytest.fixture(scope="session")
def loaded_model() -> Any:
    """SmolLM2-135M-Instruct loaded in this process (converted once, then cached)."""
    from backend.model_loader import load_model

    return load_model(EngineSettings())


@pytest.fixture(scope="session")
def tokenizer(loaded_model: Any) -> Any:
    return loaded_model.tokenizer


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(tmp_path_factory.mktemp("server") / "serve.log")
    yield running
    stop_server(running)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL cluster (tests/support/postgres.py); ``new_database()`` gives each test its own."""
    with postgres_server() as running:
        yield running
