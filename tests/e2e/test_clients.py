"""The client-library suite (tests/clients) against the session's real server.

The libraries are pinned in requirements/clients.txt and installed in .venv-clients (``make install``),
apart from llgtriton's own environment: guidance pins an older llguidance, instructor an older openai.
This test runs that suite with the server's address in the environment and fails with its report.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from backend.model_loader import checkpoint_path
from llgtriton.settings import EngineSettings
from tests.support.harness import ROOT, RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.clients]
CLIENTS_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
SUITE_TIMEOUT_S = 900


def run_suite(server: RunningServer, *paths: str) -> None:
    """The client suite's ``paths`` against ``server``; fails with its report."""
    environment = {
        **os.environ,
        "LLGTRITON_CLIENTS_BASE_URL": server.openai_base_url,
        "LLGTRITON_CLIENTS_MODEL": "SmolLM2-135M-Instruct",
        # the converted checkpoint the server runs: lm-eval counts context tokens with its tokenizer
        "LLGTRITON_CLIENTS_TOKENIZER": str(checkpoint_path(EngineSettings())),
    }
    suite = [str(CLIENTS_PYTHON), "-m", "pytest", "-c", "/dev/null", "--confcutdir=tests/clients"]
    suite += ["-p", "no:cacheprovider", "-q", "-rs", *paths]
    run = subprocess.run(
        suite, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=SUITE_TIMEOUT_S, check=False
    )
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert " passed" in report and "skipped" not in report.split("short test summary")[-1], report


@pytest.mark.skipif(not CLIENTS_PYTHON.exists(), reason="no .venv-clients: `make install` builds it")
def test_the_client_libraries_work_unmodified(server: RunningServer) -> None:
    run_suite(server, "tests/clients")


@pytest.mark.skipif(not CLIENTS_PYTHON.exists(), reason="no .venv-clients: `make install` builds it")
def test_tools_and_structured_output_in_the_models_own_format(hermes_server: RunningServer) -> None:
    """LangChain's bind_tools with every forced tool_choice, streamed and not, and the OpenAI Agents
    SDK's chat-completions model with a function tool and an output type, against a model whose
    template writes calls in <tool_call> tags (the rest of the suite runs against our own format)."""
    agents = "tests/clients/test_openai_agents.py"
    tools = "tests/clients/test_langchain.py::test_bind_tools_forced"
    run_suite(hermes_server, tools, agents, "-k", "not test_responses_output_type")  # (its tool test runs here)
