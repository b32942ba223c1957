"""logprobs under constraints, n, echo and logit_bias through the real path, parsed by the openai SDK."""

from __future__ import annotations

import json
import math
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.test_structured_output import ASK_PERSON as ASK
from tests.e2e.test_structured_output import MODEL, PERSON

pytestmark = pytest.mark.e2e

SCHEMA_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def test_constrained_chat_reports_the_logprobs_of_its_tokens(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format=SCHEMA_FORMAT,
        logprobs=True,
        top_logprobs=5,
        max_tokens=60,
        temperature=0,
    )
    choice = response.choices[0]
    jsonschema.validate(json.loads(choice.message.content or ""), PERSON)
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert "".join(token.token for token in content) == choice.message.content  # one entry per token, in order
    assert bytes(b for token in content for b in token.bytes or []).decode() == choice.message.content
    assert response.usage is not None and len(content) <= response.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0
        assert 1 <= len(token.top_logprobs) <= 5
        assert sum(math.exp(top.logprob) for top in token.top_logprobs) <= 1 + 1e-4
    # The schema allows only tokens starting with "{" first: after the mask, no other is reported.
    assert all(top.token.startswith("{") for top in content[0].top_logprobs), content[0].top_logprobs


def test_streamed_logprobs_cover_the_streamed_text(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        response_format=SCHEMA_FORMAT,
        logprobs=True,
        max_tokens=60,
        stream=True,
        temperature=0,
    )
    text, tokens = "", ""
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            tokens += "".join(t.token for t in (chunk.choices[0].logprobs and chunk.choices[0].logprobs.content) or [])
    assert tokens == text
    jsonschema.validate(json.loads(text), PERSON)


# Sampled at temperature 1, so bounded: every choice must finish within max_tokens.
SHORT_PERSON = {**PERSON, "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}}}
SHORT_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "person", "schema": SHORT_PERSON}}


def test_n_constrained_choices_each_follow_the_schema(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=SHORT_FORMAT, n=3, temperature=1.0, seed=7, max_tokens=100
    )
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    for choice in response.choices:
        jsonschema.validate(json.loads(choice.message.content or ""), SHORT_PERSON)
    again = client.chat.completions.create(
        model=MODEL, messages=ASK, response_format=SHORT_FORMAT, n=3, temperature=1.0, seed=7, max_tokens=100
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in response.choices]


def test_completion_echo_and_logprobs(client: openai.OpenAI) -> None:
    echoed = client.completions.create(model=MODEL, prompt="The capital of France is", echo=True, max_tokens=4)
    assert echoed.choices[0].text.startswith("The capital of France is")
    scored = client.completions.create(model=MODEL, prompt="The capital of France is", logprobs=3, max_tokens=4)
    logprobs = scored.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.top_logprobs is not None
    assert "".join(logprobs.tokens) == scored.choices[0].text
    assert all(len(top) <= 3 for top in logprobs.top_logprobs)


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_completion_echo_scores_the_prompt_as_lm_eval_asks(client: openai.OpenAI, max_tokens: int) -> None:
    """lm-eval's loglikelihood request: echo, logprobs 1, max_tokens 1 (or 0, as other harnesses send)."""
    prompt = "The capital of France is Paris"
    scored = client.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=1, max_tokens=max_tokens, temperature=0
    )
    choice = scored.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens is not None and logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None and logprobs.text_offset is not None
    assert scored.usage is not None
    assert len(logprobs.tokens) == scored.usage.prompt_tokens + scored.usage.completion_tokens
    assert scored.usage.completion_tokens == max_tokens
    assert "".join(logprobs.tokens) == choice.text
    assert choice.text.startswith(prompt)
    # The SDK types these columns without None; the prompt's first token, which nothing scores, has it.
    values: list[float | None] = list(logprobs.token_logprobs)
    tops: list[dict[str, float] | None] = list(logprobs.top_logprobs)
    assert values[0] is None and tops[0] is None
    for value, top in zip(values[1:], tops[1:], strict=True):
        assert value is not None and value <= 0
        assert top is not None and len(top) == 1 and max(top.values()) >= value - 1e-5
    assert logprobs.text_offset[:2] == [0, len(logprobs.tokens[0])]


def test_a_prompt_of_token_ids_is_the_prompt_of_their_text(client: openai.OpenAI, tokenizer: Any) -> None:
    prompt = "The capital of France is"
    ids = tokenizer.encode(prompt)
    as_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
    as_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0, echo=True)
    assert as_ids.choices[0].text == prompt + as_text.choices[0].text
    assert as_ids.usage is not None and as_ids.usage.prompt_tokens == len(ids)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=[10**9], max_tokens=1)
    assert "vocabulary" in caught.value.message


def test_logit_bias_forces_a_token_and_refuses_an_unknown_one(client: openai.OpenAI, tokenizer: Any) -> None:
    (banana,) = tokenizer.encode(" banana")[:1]
    response = client.completions.create(
        model=MODEL, prompt="My favourite fruit is", max_tokens=1, temperature=0, logit_bias={str(banana): 100}
    )
    assert tokenizer.encode(response.choices[0].text)[:1] == [banana]
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1, logit_bias={"99999999": 5})
    assert "vocabulary" in caught.value.message
