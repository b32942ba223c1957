"""guidance's vLLM model: its grammars (select, regex gen, json) sent as llguidance grammars."""

from __future__ import annotations

import json

import guidance
import pytest
from guidance import assistant, gen, select, user
from guidance.models.experimental import VLLMModel

from tests.clients.models import Person


@pytest.fixture
def lm(base_url: str, model: str) -> VLLMModel:
    return VLLMModel(model=model, base_url=base_url, api_key="unused")


def test_select(lm: VLLMModel) -> None:
    with user():
        lm += "Is water wet? Answer yes or no."
    with assistant():
        lm += select(["yes", "no"], name="answer")
    assert lm["answer"] in ("yes", "no")


def test_regex_gen(lm: VLLMModel) -> None:
    with user():
        lm += "What is 6 times 7?"
    with assistant():
        lm += "The answer is " + gen(regex="[0-9]{1,3}", name="number", temperature=0)
    assert lm["number"].isdigit()


def test_json(lm: VLLMModel) -> None:
    with user():
        lm += "Ann is 31 years old. Describe her as JSON."
    with assistant():
        lm += guidance.json(name="person", schema=Person, temperature=0, max_tokens=120)
    Person.model_validate(json.loads(lm["person"]))
