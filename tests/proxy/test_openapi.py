"""The served OpenAPI document, and schemathesis driving the proxy from it.

schemathesis generates requests from ``/openapi.json`` (valid ones and, in its negative phase,
ones that break the schema) and checks every answer: never a 5xx, the status codes, headers and
content types the document declares, response bodies that match their schemas, bad requests
refused. A request the schema allows may still be refused for what no schema can say: a
constraint that does not compile, or ``tool_choice`` naming a function that is not among the
tools; those are the only refusals of schema-valid requests allowed here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from proxy.protocol import MAX_TOOLS
from tests.proxy.scripted import MODEL, ScriptedClient, scripted_app

# (stored responses go to a file of this run's own)
STORE = Path(tempfile.mkdtemp(prefix="llgtriton-openapi-")) / "responses.sqlite3"
schema = schemathesis.openapi.from_asgi("/openapi.json", scripted_app(ScriptedClient(), responses_store=STORE))


async def test_openapi_document_is_served_valid_and_describes_every_route(http: httpx.AsyncClient) -> None:
    response = await http.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert set(document["paths"]) == {
        "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}", "/health", "/ready", "/metrics",
        "/v1/responses", "/v1/responses/{response_id}", "/v1/responses/{response_id}/input_items",
        "/v1/responses/{response_id}/cancel",
    }  # fmt: skip
    chat = document["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(chat["required"])
    assert chat["properties"]["model"]["enum"] == [MODEL]
    assert chat["properties"]["tools"]["anyOf"][0]["maxItems"] == MAX_TOOLS
    assert chat.get("additionalProperties", True) is True  # unknown fields are accepted, like OpenAI's


# Refusals of schema-valid requests that depend on more than one field: a tool_choice naming a
# function not among the tools, two constraints in one request, structured_outputs with two kinds,
# top_logprobs without logprobs, max_tokens 0 without echo, a tool message answering a call no
# earlier message made.
CROSS_FIELD_PARAMS = {"tools", "tool_choice", "functions", "function_call", "structured_outputs", "response_format"} | {
    "messages",
    "top_logprobs",
    "echo",
    "max_tokens",  # 0 without echo, or missing with ignore_eos
    "ignore_eos",  # with a constraint or tools
    "chat_template_kwargs",  # naming a rendering parameter
    *(f"guided_{kind}" for kind in ("json", "regex", "choice", "grammar")),
    # Responses: input items and tools are parsed one by one by their type (any object is schema-valid),
    # a function_call_output must answer a call, a stream cannot be in the background nor a
    # background response unstored, and only background responses can be cancelled. A stored
    # response's events resume after starting_after only when they are streamed.
    "starting_after",
    "input",
    "text",
    "background",
    "stream",
    "max_output_tokens",
}


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_proxy_conforms_to_its_openapi_document(case: schemathesis.Case[Any]) -> None:
    response = case.call()
    case.validate_response(response, excluded_checks=[positive_data_acceptance])
    if case.meta is not None and case.meta.generation.mode is GenerationMode.POSITIVE and response.status_code >= 400:
        error = response.json()["error"]
        if error["code"] in ("response_not_found", "previous_response_not_found"):  # ids no schema can know
            assert response.status_code == 404, error
            return
        assert response.status_code == 400, error
        assert error["code"] == "invalid_constraint" or error["param"].split(".")[0] in CROSS_FIELD_PARAMS, error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_declared_statuses_cover_a_refused_generation(http: httpx.AsyncClient, path: str) -> None:
    document = (await http.get("/openapi.json")).json()
    declared = set(document["paths"][path]["post"]["responses"])
    refused = await http.post(path, json={"model": MODEL})
    assert str(refused.status_code) in declared
