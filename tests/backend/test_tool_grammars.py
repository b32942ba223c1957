"""Tool-call grammars against real tokenizers, whose special tokens matter (Llama 3.2's: 128256 tokens)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import pytest

from backend.chat_template import ChatTemplate
from llgtriton.guides import grammar_for
from llgtriton.messages import ChatMessage
from llgtriton.tool_formats import FORMATS
from llgtriton.tools import Function, PastCall, ToolMode, ToolRequest
from llgtriton.wire import GuideType
from tests.backend.llama_tokenizer import llama_tokenizer

LLAMA_TEMPLATE = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "llama3_json.jinja"
WEATHER = Function(
    "get_weather", "The weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}}
)


@pytest.fixture(scope="module")
def llama() -> Any:
    return llama_tokenizer()


@pytest.fixture(scope="module")
def llama_llg(llama: Any) -> llguidance.LLTokenizer:
    return llguidance.hf.from_tokenizer(llama)


def matcher(tokenizer: llguidance.LLTokenizer, mode: ToolMode) -> llguidance.LLMatcher:
    lark = FORMATS["llama3_json"].grammar(ToolRequest((WEATHER,), mode))
    built = llguidance.LLMatcher(tokenizer, grammar_for(GuideType.LARK, lark), log_level=0)
    assert not built.is_error(), built.get_error()
    return built


def allowed(tokenizer: llguidance.LLTokenizer, built: llguidance.LLMatcher) -> set[int]:
    mask = np.zeros((1, (tokenizer.vocab_size + 31) // 32), dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask(built, mask, 0)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return {int(token) for token in np.flatnonzero(bits)}


@pytest.mark.parametrize("mode", [ToolMode.REQUIRED, ToolMode.AUTO])
def test_a_llama_call_as_its_tokenizer_writes_it_is_accepted(
    llama: Any, llama_llg: llguidance.LLTokenizer, mode: ToolMode
) -> None:
    built = matcher(llama_llg, mode)
    call = json.dumps({"name": "get_weather", "parameters": {"city": "Paris"}})
    assert built.consume_tokens(llama.encode(call, add_special_tokens=False)), built.get_error()
    assert built.is_accepting()


def test_no_special_token_can_open_a_forced_llama_call(llama: Any, llama_llg: llguidance.LLTokenizer) -> None:
    """The calls are constrained to the JSON; <|python_tag|> (Llama's code-interpreter marker) and
    the other special tokens cannot start them."""
    first = allowed(llama_llg, matcher(llama_llg, ToolMode.REQUIRED))
    python_tag = llama.convert_tokens_to_ids("<|python_tag|>")
    assert python_tag == 128010 and python_tag not in first
    assert first and all(llama.decode([token]).lstrip().startswith("{") for token in first)


def test_the_llama_template_renders_tools_calls_and_results(llama: Any) -> None:
    template = ChatTemplate(llama, LLAMA_TEMPLATE)
    assert template.tool_format is FORMATS["llama3_json"]
    conversation = (
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(PastCall("get_weather", '{"city": "Paris"}', "call_1"),)),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    )
    text = llama.decode(template.render(conversation, ToolRequest((WEATHER,), ToolMode.AUTO)))
    assert '"name": "get_weather"' in text and "The weather in a city" in text
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eom_id|>' in text
    assert "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>" in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
