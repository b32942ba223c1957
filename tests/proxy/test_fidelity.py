"""OpenAI fidelity in the proxy: logprobs, n, echo and logit_bias, parsed with the SDK's own types."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion as SdkCompletion
from openai.types.chat import ChatCompletion as SdkChatCompletion
from openai.types.chat import ChatCompletionChunk as SdkChatCompletionChunk
from openai.types.chat import ChatCompletionMessageParam

from llgtriton import wire
from proxy.errors import ServiceUnavailableError
from tests.proxy.scripted import MODEL, USER, ScriptedClient, sse_events

HELLO = wire.TokenLogprob(b"Hello", -0.25, (wire.Alternative(b"Hello", -0.25), wire.Alternative(b"Hi", -1.5)))
WORLD = wire.TokenLogprob(b" world", -0.5, (wire.Alternative(b" world", -0.5), wire.Alternative(b" there", -1.0)))
PARTIAL = wire.TokenLogprob(b"\xe2\x82", -2.0)  # the first two bytes of "€"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
WITH_LOGPROBS = (
    wire.GenerationOutput(text="Hello", prompt_tokens=7, completion_tokens=1, logprobs=(HELLO,)),
    wire.GenerationOutput(
        text=" world", finish_reason=wire.FinishReason.STOP, prompt_tokens=7, completion_tokens=2, logprobs=(WORLD,)
    ),
)


async def test_chat_logprobs_and_top_logprobs(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(WITH_LOGPROBS)
    response = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=2)
    assert isinstance(response, SdkChatCompletion)
    assert (client.requests[0].logprobs, client.requests[0].top_logprobs) == (True, 2)
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    content = logprobs.content
    assert [(t.token, t.logprob, t.bytes) for t in content] == [
        ("Hello", -0.25, list(b"Hello")),
        (" world", -0.5, list(b" world")),
    ]
    assert [(a.token, a.logprob) for a in content[1].top_logprobs] == [(" world", -0.5), (" there", -1.0)]


async def test_chat_without_logprobs_reports_none(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    response = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert response.choices[0].logprobs is None
    assert client.requests[0].logprobs is False


async def test_streamed_chunks_carry_their_tokens_logprobs(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(WITH_LOGPROBS)
    stream = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(chunk, SdkChatCompletionChunk) for chunk in chunks)
    reported = [
        (chunk.choices[0].delta.content, [t.token for t in chunk.choices[0].logprobs.content or []])
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs is not None
    ]
    assert reported == [("Hello", ["Hello"]), (" world", [" world"])]


async def test_a_token_holding_part_of_a_character_keeps_its_exact_bytes(
    sdk: openai.AsyncOpenAI, client: ScriptedClient
) -> None:
    client.script([wire.GenerationOutput(text="", finish_reason=wire.FinishReason.LENGTH, logprobs=(PARTIAL,))])
    response = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True)
    logprobs = response.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    content = logprobs.content
    assert content[0].bytes == [0xE2, 0x82]
    assert content[0].token == "\ufffd"


async def test_completion_logprobs_are_columns(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(WITH_LOGPROBS)
    response = await sdk.completions.create(model=MODEL, prompt="Once", logprobs=2)
    assert isinstance(response, SdkCompletion)
    assert (client.requests[0].logprobs, client.requests[0].top_logprobs) == (True, 2)
    logprobs = response.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["Hello", " world"]
    assert logprobs.token_logprobs == [-0.25, -0.5]
    assert logprobs.top_logprobs == [{"Hello": -0.25, "Hi": -1.5}, {" world": -0.5, " there": -1.0}]
    assert logprobs.text_offset == [0, 5]


async def test_top_logprobs_without_logprobs_is_a_400(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "top_logprobs": 3})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "top_logprobs"
    assert client.requests == []


async def test_n_choices_are_independent_generations(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    response = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, seed=41)
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    assert all(choice.message.content == "Hello world" for choice in response.choices)
    assert [request.seed for request in client.requests] == [41, 42, 43]  # different samples, reproducible
    assert len(set(client.request_ids)) == 3
    assert response.usage is not None
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (7, 6)  # one prompt, three outputs


async def test_n_streamed_choices_interleave_with_their_index(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    stream = await sdk.completions.create(
        model=MODEL, prompt="Once", n=2, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    texts = {0: "", 1: ""}
    finishes = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finishes[choice.index] = choice.finish_reason
    assert texts == {0: "Hello world", 1: "Hello world"}
    assert finishes == {0: "stop", 1: "stop"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


async def test_n_over_the_limit_is_a_400(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "n": 17})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "n"


async def test_one_failing_choice_fails_the_request(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(WITH_LOGPROBS, error=ServiceUnavailableError("queue full"), error_after=1)
    response = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "n": 2})
    assert response.status_code == 503


async def test_echo_prepends_the_prompt(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    response = await sdk.completions.create(model=MODEL, prompt="Once upon", echo=True)
    assert response.choices[0].text == "Once uponHello world"
    stream = await sdk.completions.create(model=MODEL, prompt="Once upon", echo=True, stream=True)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == "Once uponHello world"


PROMPT_SCORES = wire.PromptLogprobs(
    b"Once",
    (wire.TokenLogprob(b" upon", -1.0, (wire.Alternative(b" upon", -1.0), wire.Alternative(b" more", -2.0))),),
)


@pytest.mark.parametrize("max_tokens", [0, 2])
async def test_echo_with_logprobs_scores_the_prompt(
    sdk: openai.AsyncOpenAI, client: ScriptedClient, max_tokens: int
) -> None:
    """lm-eval's loglikelihood request: the prompt's tokens come back scored, the first one unscored."""
    generated = WITH_LOGPROBS if max_tokens else (wire.GenerationOutput("", wire.FinishReason.LENGTH, 7, 0, ()),)
    client.script([dataclasses.replace(generated[0], prompt_logprobs=PROMPT_SCORES), *generated[1:]])
    response = await sdk.completions.create(
        model=MODEL, prompt="Once upon", echo=True, logprobs=2, max_tokens=max_tokens
    )
    (request,) = client.requests
    assert (request.prompt_logprobs, request.top_logprobs, request.max_tokens) == (True, 2, max_tokens)
    choice = response.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None
    words = ["Hello", " world"] if max_tokens else []
    assert choice.text == "Once upon" + "".join(words)
    assert logprobs.tokens == ["Once", " upon", *words]
    assert logprobs.token_logprobs == [None, -1.0, *([-0.25, -0.5] if max_tokens else [])]
    assert logprobs.top_logprobs is not None
    assert logprobs.top_logprobs[:2] == [None, {" upon": -1.0, " more": -2.0}]
    assert logprobs.text_offset == [0, 4, 9, 14][: 2 + len(words)]
    assert choice.finish_reason == ("stop" if max_tokens else "length")


@pytest.mark.parametrize("stream", [False, True])
async def test_a_prompt_scored_for_n_choices_is_scored_once(
    sdk: openai.AsyncOpenAI, client: ScriptedClient, stream: bool
) -> None:
    """Nothing is sampled: the n choices are one scoring, each under its own index."""
    client.script([wire.GenerationOutput("", wire.FinishReason.LENGTH, 7, 0, (), prompt_logprobs=PROMPT_SCORES)])
    fields: dict[str, Any] = {"model": MODEL, "prompt": "Once upon", "echo": True, "logprobs": 1, "max_tokens": 0}
    if stream:
        chunks = [c async for c in await sdk.completions.create(**fields, n=4, stream=True)]
        texts = {index: "".join(c.choices[0].text for c in chunks if c.choices[0].index == index) for index in range(4)}
        assert texts == dict.fromkeys(range(4), "Once upon")
    else:
        response = await sdk.completions.create(**fields, n=4)
        assert [(c.index, c.text, c.finish_reason) for c in response.choices] == [
            (i, "Once upon", "length") for i in range(4)
        ]
    assert len(client.requests) == 1


async def test_streamed_echo_carries_the_prompt_scores_first(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script([dataclasses.replace(WITH_LOGPROBS[0], prompt_logprobs=PROMPT_SCORES), WITH_LOGPROBS[1]])
    stream = await sdk.completions.create(model=MODEL, prompt="Once upon", echo=True, logprobs=1, stream=True)
    chunks = [chunk async for chunk in stream]
    first = chunks[0].choices[0]
    assert first.text == "Once upon"
    assert first.logprobs is not None and first.logprobs.token_logprobs == [None, -1.0]
    texts = [chunk.choices[0].text for chunk in chunks if chunk.choices]
    assert "".join(texts) == "Once uponHello world"


async def test_echo_without_logprobs_asks_for_no_scores(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    client.script(WITH_LOGPROBS)
    response = await sdk.completions.create(model=MODEL, prompt="Once upon", echo=True)
    assert client.requests[0].prompt_logprobs is False
    assert response.choices[0].text == "Once uponHello world"
    assert response.choices[0].logprobs is None


async def test_max_tokens_0_without_echo_is_a_400(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 0})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "max_tokens"
    assert client.requests == []


async def test_logit_bias_reaches_the_backend(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, logit_bias={"42": 5, "7": -100})
    assert client.requests[0].logit_bias == ((42, 5.0), (7, -100.0))


async def test_ignore_eos_reaches_the_backend(sdk: openai.AsyncOpenAI, client: ScriptedClient) -> None:
    """What aiperf and vLLM's benchmarks send for fixed output lengths."""
    await sdk.completions.create(model=MODEL, prompt="x", max_tokens=8, extra_body={"ignore_eos": True})
    await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, extra_body={"ignore_eos": True})
    assert [request.ignore_eos for request in client.requests] == [True, True]


async def test_ignore_eos_without_max_tokens_is_a_400(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    """Else one request with n choices would hold its batch slots to the end of the context."""
    body = {"model": MODEL, "messages": USER, "ignore_eos": True, "n": 8}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens"
    assert client.requests == []


async def test_ignore_eos_with_a_constraint_is_a_400(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    for extra in ({"response_format": {"type": "json_object"}}, {"tools": [tool]}):
        body: dict[str, Any] = {"model": MODEL, "messages": USER, "ignore_eos": True, **extra}
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, extra
        assert response.json()["error"]["param"] == "ignore_eos"
    assert client.requests == []


async def test_bad_logit_bias_is_a_400(http: httpx.AsyncClient) -> None:
    for bias in ({"x": 1}, {"1": 101}, {"1": "high"}):
        body: dict[str, Any] = {"model": MODEL, "messages": USER, "logit_bias": bias}
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, bias
        assert response.json()["error"]["param"].startswith("logit_bias"), bias


async def test_streamed_events_are_json_with_logprobs(http: httpx.AsyncClient, client: ScriptedClient) -> None:
    client.script(WITH_LOGPROBS)
    body = {"model": MODEL, "messages": USER, "stream": True, "logprobs": True}
    events = sse_events(await http.post("/v1/chat/completions", json=body))
    assert json.dumps(events[1]["choices"][0]["logprobs"]["content"][0]["token"]) == '"Hello"'


@pytest.mark.parametrize("prompt", [[464, 3290], [[464, 3290]]])
async def test_a_prompt_of_token_ids_reaches_the_backend_as_ids(
    sdk: openai.AsyncOpenAI, client: ScriptedClient, prompt: list[int] | list[list[int]]
) -> None:
    """lm-eval's local-completions sends prompts as token ids by default (tokenized_requests)."""
    client.script([dataclasses.replace(WITH_LOGPROBS[0], prompt_logprobs=PROMPT_SCORES), WITH_LOGPROBS[1]])
    response = await sdk.completions.create(model=MODEL, prompt=prompt, echo=True, max_tokens=2)
    (request,) = client.requests
    assert (request.prompt, request.prompt_token_ids) == (None, (464, 3290))
    assert request.prompt_logprobs  # an echoed prompt of ids is written back from its scored tokens
    assert response.choices[0].text == "Once uponHello world"
    assert response.choices[0].logprobs is None


@pytest.mark.parametrize("prompt", [[], [[]], [[1], [2]], [-1], [1.5], [[1, "a"]]])
async def test_bad_token_id_prompts_are_a_400(http: httpx.AsyncClient, client: ScriptedClient, prompt: Any) -> None:
    response = await http.post("/v1/completions", json={"model": MODEL, "prompt": prompt})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "prompt"
    assert client.requests == []
