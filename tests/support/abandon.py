"""vLLM's cancellation scenario: many clients that give up on their requests at once.

``tests/e2e/test_reliability.py`` asserts that a new request is still served quickly afterwards;
``bench.abandon`` times it, round after round.
"""

from __future__ import annotations

import asyncio
from typing import Any

import openai

ABANDONED = 200
GIVE_UP_S = 0.5


async def _abandon(client: openai.AsyncOpenAI, model: str, index: int, bias: dict[str, int] | openai.Omit) -> bool:
    """A request whose client gives up GIVE_UP_S after sending it, whatever has arrived by then;
    True when it was abandoned.

    The client's own timeout would not do: httpx applies it to each read, so a stream that keeps
    receiving chunks never times out, and finishes once the other clients have left.
    """
    messages: Any = [{"role": "user", "content": f"Tell me a very long story, number {index}."}]
    try:
        async with asyncio.timeout(GIVE_UP_S):
            if index % 2:
                async for _ in await client.chat.completions.create(
                    model=model, messages=messages, max_tokens=400, stream=True, logit_bias=bias
                ):
                    pass
            else:
                await client.chat.completions.create(model=model, messages=messages, max_tokens=400, logit_bias=bias)
    except TimeoutError:
        return True
    return False


async def abandon_requests(base_url: str, model: str, logit_bias: dict[str, int] | None = None) -> int:
    """ABANDONED chat requests (every other one streaming, 400 tokens each) whose clients all give up
    after GIVE_UP_S; returns how many were abandoned (a request may finish first). ``logit_bias``
    can forbid the end tokens, so that no story ends early (the test does)."""
    bias = logit_bias or openai.omit
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30) as client:
        outcomes = await asyncio.gather(*(_abandon(client, model, index, bias) for index in range(ABANDONED)))
    return sum(outcomes)
