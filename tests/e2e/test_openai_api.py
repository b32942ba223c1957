"""The OpenAI API through the real path: openai SDK → proxy → Triton gRPC → python backend → SmolLM2."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import httpx
import openai
import pytest

from tests.support.harness import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
MESSAGES: list[Any] = [{"role": "user", "content": "Name three colours."}]


def chat_text(client: openai.OpenAI, **kwargs: Any) -> str:
    response = client.chat.completions.create(model=MODEL, **kwargs)
    return response.choices[0].message.content or ""


def test_models_are_listed(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_counts_tokens_like_the_tokenizer(client: openai.OpenAI, tokenizer: Any) -> None:
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0)
    prompt_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert response.object == "chat.completion"
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(prompt_ids)
    assert response.usage.completion_tokens == 12
    assert response.usage.total_tokens == len(prompt_ids) + 12
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content


def test_chat_stream_matches_the_whole_response(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    assert finishes == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1, "text arrived in one piece"


def test_stream_without_include_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, stream=True)
    )
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completions_whole_and_streamed(client: openai.OpenAI, tokenizer: Any) -> None:
    prompt = "The three primary colours are"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt))
    assert whole.usage.completion_tokens == 10
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage == whole.usage


def test_completions_default_to_16_tokens(client: openai.OpenAI) -> None:
    response = client.completions.create(model=MODEL, prompt="Once upon a time", temperature=0)
    assert response.usage is not None
    assert response.usage.completion_tokens == 16


def test_max_completion_tokens(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_completion_tokens=5, temperature=0)
    assert response.usage is not None and response.usage.completion_tokens == 5
    assert response.choices[0].finish_reason == "length"


def test_end_of_sequence_finishes_with_stop(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=200, temperature=0
    )
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None and response.usage.completion_tokens < 200
    assert "<|im_end|>" not in (response.choices[0].message.content or "")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_never_returned(client: openai.OpenAI, stream: bool) -> None:
    prompt = "Once upon a time, there was a cat who"
    free = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    # A stop string that spans several tokens, in the middle of the free-running text.
    stop = free[8:15]
    assert len(stop.strip()) >= 3, free
    expected = free[: free.find(stop)]
    if stream:
        chunks = list(
            client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop], stream=True
            )
        )
        pieces = [c.choices[0].text for c in chunks]
        text = "".join(pieces)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
        assert all(stop not in "".join(pieces[: i + 1]) for i in range(len(pieces)))
    else:
        response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
        text = response.choices[0].text
        finish = [response.choices[0].finish_reason]
    assert text == expected
    assert finish == ["stop"]


def test_same_seed_same_output(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        return chat_text(client, messages=MESSAGES, max_tokens=16, temperature=1.0, seed=seed)

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(seed) != first for seed in (1, 2, 3))


def test_top_k_one_and_tiny_top_p_are_greedy(client: openai.OpenAI) -> None:
    greedy = chat_text(client, messages=MESSAGES, max_tokens=12, temperature=0)
    top_k = chat_text(client, messages=MESSAGES, max_tokens=12, temperature=1.0, seed=7, extra_body={"top_k": 1})
    top_p = chat_text(client, messages=MESSAGES, max_tokens=12, temperature=1.0, seed=7, top_p=1e-9)
    assert top_k == greedy
    assert top_p == greedy


def test_frequency_and_presence_penalties_reduce_repetition(client: openai.OpenAI, tokenizer: Any) -> None:
    (hello,) = tokenizer.encode(" hello", add_special_tokens=False)

    def hellos(frequency_penalty: float = 0.0, presence_penalty: float = 0.0) -> int:
        response = client.completions.create(
            model=MODEL,
            prompt="hello hello hello hello hello hello",
            max_tokens=24,
            temperature=0,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
        )
        return Counter(tokenizer.encode(response.choices[0].text))[hello]

    plain = hellos()
    assert plain >= 4  # without penalties the model keeps repeating
    assert hellos(frequency_penalty=2.0) < plain
    assert hellos(presence_penalty=2.0) < plain


def test_streamed_text_is_valid_utf8_in_every_chunk(server: RunningServer, tokenizer: Any) -> None:
    body = {"model": MODEL, "prompt": "中文：你好，世界。我们", "max_tokens": 24, "temperature": 0, "stream": True}
    pieces: list[str] = []
    with httpx.stream("POST", f"{server.openai_base_url}/completions", json=body, timeout=120) as response:
        for raw in response.iter_raw():
            assert raw.decode("utf-8")  # raises if a chunk is not valid UTF-8 on its own
            for event in raw.split(b"\n\n"):
                if event.startswith(b"data: {"):
                    pieces.append(json.loads(event[6:])["choices"][0]["text"])
    assert all("\ufffd" not in piece for piece in pieces)
    text = "".join(pieces)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids), "no character was split across tokens"


def test_concurrent_streams_match_sequential_results(server: RunningServer, client: openai.OpenAI) -> None:
    prompts = ["Name a fruit.", "Name a planet.", "Name an animal.", "Name a country."]
    sequential = [
        chat_text(client, messages=[{"role": "user", "content": p}], max_tokens=12, temperature=0) for p in prompts
    ]

    async def run_all() -> list[str]:
        async_client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="unused", max_retries=0)

        async def one(prompt: str) -> str:
            stream = await async_client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=12, temperature=0, stream=True
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        try:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        finally:
            await async_client.close()

    assert asyncio.run(run_all()) == sequential


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(
    server: RunningServer, client: openai.OpenAI
) -> None:
    url = f"{server.openai_base_url}/chat/completions"
    malformed = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert malformed.status_code == 400
    assert malformed.json()["error"]["type"] == "invalid_request_error"

    missing = httpx.post(url, json={"model": MODEL})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "messages"

    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert not_found.value.code == "model_not_found"

    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1_000_000)
    assert "8192" in str(too_long.value)

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=3)

    assert chat_text(client, messages=MESSAGES, max_tokens=3, temperature=0)
