"""``--triton-instances``: one tritonserver running several python backend stubs of the model."""

from __future__ import annotations

import asyncio

import pytest

from launcher.triton_server import STUB_NAME, live_children
from llgtriton import wire
from proxy.triton_client import TritonGenerationClient
from tests.support.harness import free_port, start_process, stop_process, triton_ports_argv

pytestmark = pytest.mark.e2e


async def _stream(client: TritonGenerationClient, index: int) -> str:
    request = wire.GenerationRequest(prompt=f"request {index}", max_tokens=8, stream=True)
    return "".join([output.text async for output in client.generate(request, f"instances-{index}")])


@pytest.mark.parametrize("core_process", ["off", "on"])
async def test_two_instances_run_two_stubs_that_serve_requests(
    tmp_path_factory: pytest.TempPathFactory, core_process: str
) -> None:
    """With the engine in a process of its own, the two stubs share one: one model in memory."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    argv = [
        "triton",
        *triton_ports_argv(http_port, grpc_port, metrics_port),
        "--engine-engine=synthetic",
        f"--engine-core-process={core_process}",
        "--triton-instances=2",
    ]
    log = tmp_path_factory.mktemp("instances") / "triton.log"
    launcher = start_process(log, argv, f"http://127.0.0.1:{http_port}/v2/models/llm/ready")
    try:
        (tritonserver,) = live_children(launcher.pid, "tritonserver")
        stubs = live_children(tritonserver, STUB_NAME)
        assert len(stubs) == 2
        cores = [core for stub in stubs for core in live_children(stub, "spawn_main")]
        assert len(cores) == (1 if core_process == "on" else 0)
        client = TritonGenerationClient(f"127.0.0.1:{grpc_port}", "llm", 60)
        try:
            texts = await asyncio.gather(*(_stream(client, index) for index in range(16)))
        finally:
            await client.close()
        assert texts == [" token" * 8] * 16
    finally:
        stop_process(launcher)
