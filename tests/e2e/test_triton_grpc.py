"""The Triton model used directly, without the proxy, by a plain tritonclient gRPC streaming client."""

from __future__ import annotations

import json
import queue
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient

from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

PROMPT = "The three primary colours are"


def tensor(name: str, value: Any, datatype: str) -> grpcclient.InferInput:
    """A ``[1, 1]`` input, as TensorRT-LLM ensemble clients send them."""
    array = np.array([[value]], dtype=np.object_ if datatype == "BYTES" else None)
    if datatype == "INT32":
        array = array.astype(np.int32)
    elif datatype == "FP32":
        array = array.astype(np.float32)
    item = grpcclient.InferInput(name, [1, 1], datatype)
    item.set_data_from_numpy(array)
    return item


def run_stream(server: RunningServer, inputs: list[grpcclient.InferInput]) -> list[tuple[Any, Any]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("llm", inputs, request_id="direct-1", enable_empty_final_response=True)
        received = []
        while True:
            result, error = results.get(timeout=120)
            received.append((result, error))
            if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                return received
    finally:
        client.stop_stream()
        client.close()


def text_of(result: Any) -> str:
    return "".join(v.decode() for v in result.as_numpy("text_output").reshape(-1))


def test_streaming_client_gets_text_output(server: RunningServer) -> None:
    received = run_stream(
        server,
        [
            tensor("text_input", PROMPT.encode(), "BYTES"),
            tensor("max_tokens", 10, "INT32"),
            tensor("stream", True, "BOOL"),
            tensor("temperature", 0.0, "FP32"),
        ],
    )
    assert all(error is None for _, error in received)
    assert len(received) > 2, "a streaming request should produce several responses"
    final = received[-1][0]
    assert final.as_numpy("finish_reason").reshape(-1)[0] == b"length"
    assert int(final.as_numpy("num_output_tokens").reshape(-1)[0]) == 10
    text = "".join(text_of(result) for result, _ in received)
    with openai.OpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0) as proxy:
        same = proxy.completions.create(model="SmolLM2-135M-Instruct", prompt=PROMPT, max_tokens=10, temperature=0)
    assert text == same.choices[0].text


def test_non_streaming_request_gets_one_response(server: RunningServer) -> None:
    received = run_stream(
        server,
        [
            tensor("text_input", PROMPT.encode(), "BYTES"),
            tensor("max_tokens", 6, "INT32"),
            tensor("temperature", 0.0, "FP32"),
        ],
    )
    assert len(received) == 1
    result, error = received[0]
    assert error is None
    assert text_of(result)
    assert int(result.as_numpy("num_output_tokens").reshape(-1)[0]) == 6


def test_prompt_logprobs_come_with_the_first_response(server: RunningServer) -> None:
    received = run_stream(
        server,
        [
            tensor("text_input", PROMPT.encode(), "BYTES"),
            tensor("max_tokens", 0, "INT32"),
            tensor("return_prompt_log_probs", True, "BOOL"),
            tensor("top_logprobs", 2, "INT32"),
        ],
    )
    ((result, error),) = received
    assert error is None
    scores = json.loads(result.as_numpy("prompt_logprobs").reshape(-1)[0])
    prompt_tokens = int(result.as_numpy("num_input_tokens").reshape(-1)[0])
    assert len(scores["rest"]) == prompt_tokens - 1
    assert bytes(scores["first"]) + b"".join(bytes(entry["token"]) for entry in scores["rest"]) == PROMPT.encode()
    assert all(entry["logprob"] <= 0 and len(entry["top"]) == 2 for entry in scores["rest"])
    assert int(result.as_numpy("num_output_tokens").reshape(-1)[0]) == 0


def test_bad_request_gets_a_triton_error(server: RunningServer) -> None:
    received = run_stream(server, [tensor("max_tokens", 6, "INT32")])
    (_, error), *_ = received
    assert error is not None
    assert "text_input" in str(error)
