"""Triton's own ports are no way around the proxy: admin APIs are locked, inference needs its key when set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from launcher.triton_server import live_children
from llgtriton.wire import ADMIN_KEY_HEADER, INFERENCE_KEY_HEADER
from tests.support.attacks import NORMAL, TritonAttack, triton_attack
from tests.support.harness import RunningServer, start_server, stop_server

pytestmark = pytest.mark.e2e

KEY = "a-triton-key"
HELLO = TritonAttack("a normal request", {})  # text_input "Hi", 4 tokens


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("keyed") / "serve.log", f"--triton-inference-key={KEY}", "--triton-admin-key=admin"
    )
    yield running
    stop_server(running)


def triton_http(server: RunningServer) -> str:
    return f"http://127.0.0.1:{server.http_port}"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/llm/unload"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("GET", "/v2/logging"),
        ("GET", "/v2/trace/setting"),
    ],
)
def test_admin_apis_are_refused_without_the_admin_key(server: RunningServer, method: str, path: str) -> None:
    reply = httpx.request(method, triton_http(server) + path, timeout=10)
    assert reply.status_code == 403, reply.text
    assert httpx.get(triton_http(server) + "/v2/models/llm/ready", timeout=10).status_code == 200


def test_the_admin_key_opens_the_admin_apis(keyed_server: RunningServer) -> None:
    url = triton_http(keyed_server) + "/v2/repository/index"
    assert httpx.post(url, headers={ADMIN_KEY_HEADER: "wrong"}, timeout=10).status_code == 403
    assert httpx.post(url, headers={ADMIN_KEY_HEADER: "admin"}, timeout=10).status_code == 200


def test_inference_needs_the_key_and_the_proxy_sends_it(keyed_server: RunningServer) -> None:
    error = triton_attack(keyed_server.grpc_url, HELLO)
    assert error is not None and "restricted" in error, error
    reply = httpx.post(keyed_server.openai_base_url + "/completions", json=NORMAL, timeout=60)
    assert reply.status_code == 200, reply.text
    infer = httpx.post(
        triton_http(keyed_server) + "/v2/models/llm/infer",
        json={"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["Hi"]}]},
        timeout=60,
    )
    assert infer.status_code == 403
    keyed = httpx.post(
        triton_http(keyed_server) + "/v2/models/llm/infer",
        json={"inputs": [{"name": "text_input", "shape": [1, 1], "datatype": "BYTES", "data": ["Hi"]}]},
        headers={INFERENCE_KEY_HEADER: KEY},
        timeout=60,
    )
    assert keyed.status_code != 403  # past the key (the decoupled model answers HTTP with its own error)


def test_the_keys_are_neither_in_the_process_list_nor_in_the_log(keyed_server: RunningServer) -> None:
    """tritonserver takes them on its command line: the launcher overwrites them there once read."""
    (triton,) = live_children(keyed_server.pid, "tritonserver")
    shown = Path(f"/proc/{triton}/cmdline").read_bytes().decode().split("\0")
    restricted = [argument for argument in shown if "restricted" in argument]
    assert len(restricted) == 4 and all(argument.endswith("*****") for argument in restricted)
    assert not [argument for argument in shown if argument.endswith((f"={KEY}", "=admin"))]
    log = keyed_server.log.read_text()
    assert f"={KEY}" not in log and "key=admin" not in log
