"""``llgtriton serve`` as a user runs it: a chat template file, then Ctrl-C (or SIGTERM) stops everything."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.harness import ROOT, free_port, start_server, stop_process, stop_server, triton_ports_argv

pytestmark = pytest.mark.e2e

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tritonserver_running(grpc_port: int) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"tritonserver") for arg in argv) and f"--grpc-port={grpc_port}".encode() in argv:
            return True
    return False


def test_chat_template_file_then_ctrl_c(tmp_path: Path, tokenizer: Any) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE)
    server = start_server(tmp_path / "serve.log", f"--engine-chat-template={template}")
    try:
        messages: list[Any] = [{"role": "user", "content": "Hi"}]
        with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0) as client:
            response = client.chat.completions.create(
                model="SmolLM2-135M-Instruct", messages=messages, max_tokens=2, temperature=0
            )
        ours = tokenizer.apply_chat_template(
            messages, chat_template=TEMPLATE, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        default = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert len(ours) != len(default)  # the model's own template adds a system prompt
        assert response.usage is not None and response.usage.prompt_tokens == len(ours)
    finally:
        code = stop_server(server)
    assert code in (0, 130), server.log_tail()  # 130: uvicorn re-raises the SIGINT it handled
    assert not _tritonserver_running(server.grpc_port)
    assert not _port_open(server.proxy_port)
    assert not _port_open(server.grpc_port)


def test_sigterm_stops_tritonserver_too(tmp_path: Path) -> None:
    """docker stop and Kubernetes send SIGTERM: Triton and its stub must not outlive the launcher."""
    server = start_server(tmp_path / "serve.log", "--engine-engine=synthetic")
    code = stop_process(server.process, signum=signal.SIGTERM)
    assert code == 0, server.log_tail()  # a clean stop: the proxy workers drained, then Triton stopped
    assert "stopping tritonserver" in server.log_tail()
    assert not _tritonserver_running(server.grpc_port)
    assert not _port_open(server.grpc_port)


def test_ctrl_c_while_the_model_loads_stops_a_server_started_as_a_background_job(tmp_path: Path) -> None:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log = tmp_path / "triton.log"
    argv = ["triton", *triton_ports_argv(http_port, grpc_port, metrics_port), "--engine-engine=synthetic"]
    with log.open("wb") as handle:
        # SIGINT ignored, as a background job of a shell inherits it; exec keeps that.
        process = subprocess.Popen(
            ["sh", "-c", 'trap \'\' INT; exec "$0" "$@"', sys.executable, "-m", "launcher.cli", *argv],
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "loading the model into Triton" not in log.read_text(errors="replace"):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)  # before the model is ready, before the event loop runs
        assert process.wait(60) == 130
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert "stopping tritonserver" in log.read_text(errors="replace")
    assert not _tritonserver_running(grpc_port)
