"""The tool-call requests of ``bench.step_breakdown``, prepared by the backend's own service: their
grammar takes a valid call and their check passes it; the check refuses anything else. SmolLM2's
own template (the generic format), a hermes template, and Llama 3.2's tokenizer with a Llama 3 JSON
template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llguidance
import pytest

from backend.chat_template import ChatTemplate
from backend.contract import ResponseSink
from backend.guidance_tokenizer import guidance_tokenizer
from backend.requests import EngineRequest
from backend.service import GenerationService
from backend.telemetry import StepCounters
from bench.tool_requests import ToolCallRequests
from llgtriton.tools import PastCall
from tests.backend.llama_tokenizer import llama_tokenizer

TEMPLATES = Path(__file__).parents[1] / "fixtures" / "chat_templates"


class NoRunner:
    """Preparing a request never reaches the engine: nothing here may be submitted."""

    counters = StepCounters()

    def load(self) -> tuple[int, int]:
        return 0, 0

    def submit(self, request: EngineRequest, sink: ResponseSink) -> None:
        raise AssertionError("preparing a request submitted it")

    def shutdown(self) -> None:
        pass


def prepared(hf: Any, template: ChatTemplate, count: int) -> ToolCallRequests:
    service = GenerationService(hf, template, NoRunner(), vocab_size=len(hf), max_model_len=4096)
    return ToolCallRequests.prepared_by(service, count, max_tokens=64)


@pytest.fixture(scope="module", params=["generic", "hermes", "llama3_json"])
def hf_and_template(request: pytest.FixtureRequest, tokenizer: Any) -> tuple[Any, ChatTemplate]:
    if request.param == "generic":
        return tokenizer, ChatTemplate(tokenizer)
    hf = llama_tokenizer() if request.param == "llama3_json" else tokenizer
    template = ChatTemplate(hf, TEMPLATES / f"{request.param}.jinja")
    assert template.tool_format.name == request.param
    return hf, template


def written(requests: ToolCallRequests, call: PastCall) -> str:
    """``call`` as the model writes it when it must call: a listed format's trigger only where it is always written."""
    text = requests.form.write([call])
    if requests.form.listed and not requests.form.always_triggered:
        return text[len(requests.form.trigger) :]
    return text


def test_a_valid_call_is_what_the_grammar_takes_and_the_check_passes(hf_and_template: tuple[Any, ChatTemplate]) -> None:
    hf, template = hf_and_template
    requests = prepared(hf, template, 2)
    first, second = requests.requests
    assert first.grammar is not None and first.grammar == second.grammar
    assert first.prompt_ids != second.prompt_ids
    assert first.sampling.temperature == 0.0 and first.stream and first.max_tokens == 64
    text = written(requests, PastCall("get_weather", '{"city": "Paris", "unit": "celsius"}'))
    assert not requests.invalid(text)
    guidance = guidance_tokenizer(hf, len(hf), [hf.eos_token_id])
    matcher = llguidance.LLMatcher(guidance, first.grammar, log_level=0)
    assert matcher.consume_tokens(guidance.tokenize_str(text)), matcher.get_error()
    assert matcher.is_accepting()


@pytest.mark.parametrize(
    "call",
    [
        PastCall("get_weather", '{"city": "Paris", "unit": "kelvin"}'),  # not one of the units
        PastCall("get_weather", '{"city": "Paris"}'),  # the unit is required
        PastCall("get_time", '{"city": "Paris", "unit": "celsius"}'),  # no such tool
    ],
)
def test_a_wrong_call_fails_the_check(hf_and_template: tuple[Any, ChatTemplate], call: PastCall) -> None:
    requests = prepared(*hf_and_template, 1)
    assert requests.invalid(written(requests, call))


def test_text_without_a_call_fails_the_check(hf_and_template: tuple[Any, ChatTemplate]) -> None:
    requests = prepared(*hf_and_template, 1)
    assert requests.invalid("It is sunny in Paris.")
