"""Tool-call grammars against real tokenizers, whose special tokens matter (Llama 3.2's: 128256 tokens;
Qwen 3.6's: 248077, with its tags as special tokens)."""

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
from backend.detokenizer import IncrementalDetokenizer
from llgtriton.guides import grammar_for
from llgtriton.messages import ChatMessage
from llgtriton.reasoning import REASONING_FORMATS
from llgtriton.reasoning import TAGS as REASONING_TAGS
from llgtriton.tool_formats import FORMATS
from llgtriton.tools import Function, PastCall, ToolMode, ToolRequest
from llgtriton.wire import GuideType
from tests.backend.llama_tokenizer import llama_tokenizer
from tests.backend.qwen_tokenizer import qwen_tokenizer

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


def test_a_forced_llama_call_may_open_with_python_tag_and_no_other_special_token(
    llama: Any, llama_llg: llguidance.LLTokenizer
) -> None:
    """<|python_tag|>, which Llama writes before calls at times, and the call's JSON; the marker is
    left out of the text, so the proxy reads the same call either way."""
    template = ChatTemplate(llama, LLAMA_TEMPLATE)
    python_tag = llama.convert_tokens_to_ids("<|python_tag|>")
    assert python_tag == 128010 and template.special_tokens == {"<|python_tag|>": python_tag}
    lark = template.tool_format.grammar(ToolRequest((WEATHER,), ToolMode.REQUIRED), special=template.special_tokens)
    first = allowed(llama_llg, compiled(llama_llg, lark)) - {python_tag}
    assert python_tag in allowed(llama_llg, compiled(llama_llg, lark))
    assert first and all(llama.decode([token]).lstrip().startswith("{") for token in first)
    call = llama.encode(json.dumps({"name": "get_weather", "parameters": {"city": "Paris"}}), add_special_tokens=False)
    assert takes(compiled(llama_llg, lark), [python_tag, *call])
    detokenizer = IncrementalDetokenizer(llama)
    assert "".join(detokenizer.push(token) for token in [python_tag, *call]).startswith('{"name"')


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


# Tags that are special tokens: a grammar must name the token, which no spelled-out text matches --------

MISTRAL_TEMPLATE = Path(__file__).parents[1] / "fixtures" / "chat_templates" / "mistral.jinja"
PARIS_LIST = json.dumps([{"name": "get_weather", "arguments": {"city": "Paris"}}])


@pytest.fixture(scope="module")
def mistral_like() -> Any:
    """Llama 3.2's tokenizer with Mistral's [TOOL_CALLS] added as a special token (as Mistral's own has it)."""
    tokenizer = llama_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    return tokenizer


def compiled(tokenizer: llguidance.LLTokenizer, lark: str) -> llguidance.LLMatcher:
    built = llguidance.LLMatcher(tokenizer, grammar_for(GuideType.LARK, lark), log_level=0)
    assert not built.is_error(), built.get_error()
    return built


def takes(built: llguidance.LLMatcher, tokens: list[int]) -> bool:
    return bool(built.consume_tokens(tokens)) and built.is_accepting()


def test_mistral_calls_open_with_the_special_token_forced_or_not(mistral_like: Any) -> None:
    template = ChatTemplate(mistral_like, MISTRAL_TEMPLATE)
    trigger = mistral_like.convert_tokens_to_ids("[TOOL_CALLS]")
    assert template.tool_format is FORMATS["mistral"]
    assert template.special_tokens == {"[TOOL_CALLS]": trigger}
    guidance = llguidance.hf.from_tokenizer(mistral_like)
    calls = mistral_like.encode(PARIS_LIST, add_special_tokens=False)
    spelled = [mistral_like.encode(part, add_special_tokens=False) for part in ("[TOOL", "_CALLS]" + PARIS_LIST)]
    spelled = spelled[0] + spelled[1]
    text = mistral_like.encode("Let me check.", add_special_tokens=False)
    for mode in (ToolMode.REQUIRED, ToolMode.AUTO):
        lark = template.tool_format.grammar(ToolRequest((WEATHER,), mode), special=template.special_tokens)
        assert takes(compiled(guidance, lark), [trigger, *calls])
        assert not takes(compiled(guidance, lark), spelled)  # the reader could not tell it from the token
    auto = template.tool_format.grammar(ToolRequest((WEATHER,), ToolMode.AUTO), special=template.special_tokens)
    assert takes(compiled(guidance, auto), [*text, trigger, *calls])
    assert takes(compiled(guidance, auto), text)
    assert allowed(guidance, compiled(guidance, auto)) >= {trigger, *text[:1]}


def test_mistral_tool_conversations_render_with_the_ids_its_template_demands(mistral_like: Any) -> None:
    template = ChatTemplate(mistral_like, MISTRAL_TEMPLATE)
    conversation = (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(PastCall("get_weather", '{"city": "Paris"}', "call_0123abcdef"),)),
        ChatMessage("tool", "sunny", tool_call_id="call_0123abcdef"),
    )
    text = mistral_like.decode(template.render(conversation, ToolRequest((WEATHER,), ToolMode.AUTO)))
    mapped = FORMATS["mistral"].template_call_id("call_0123abcdef")
    assert mapped is not None and len(mapped) == 9 and mapped.isalnum()
    assert '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"' in text
    assert "[INST]Be brief.\n\nWeather in Paris?[/INST]" in text
    assert f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {{"city": "Paris"}}, "id": "{mapped}"}}]' in text
    assert f'[TOOL_RESULTS]{{"content": "sunny", "call_id": "{mapped}"}}[/TOOL_RESULTS]' in text


def test_the_detokenizer_writes_kept_special_tokens_and_skips_the_others(mistral_like: Any) -> None:
    trigger = mistral_like.convert_tokens_to_ids("[TOOL_CALLS]")
    ids = [trigger, *mistral_like.encode(PARIS_LIST, add_special_tokens=False), mistral_like.eos_token_id]
    kept = IncrementalDetokenizer(mistral_like, kept={trigger})
    assert "".join(kept.push(token) for token in ids) + kept.flush() == "[TOOL_CALLS]" + PARIS_LIST
    plain = IncrementalDetokenizer(mistral_like)
    assert "".join(plain.push(token) for token in ids) + plain.flush() == PARIS_LIST


@pytest.fixture(scope="module")
def qwen() -> tuple[llguidance.LLTokenizer, dict[str, int]]:
    return qwen_tokenizer()


def test_qwen_calls_between_special_tag_tokens(qwen: tuple[llguidance.LLTokenizer, dict[str, int]]) -> None:
    tokenizer, special = qwen
    form = FORMATS["hermes"]
    tags = {tag: special[tag] for tag in form.tags}
    assert set(tags) == {"<tool_call>", "</tool_call>"}
    call = tokenizer.tokenize_str('\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n')
    tagged = [tags["<tool_call>"], *call, tags["</tool_call>"]]
    spelled = tokenizer.tokenize_str(tokenizer.decode_str(tagged).replace("\xff", ""))
    for mode in (ToolMode.REQUIRED, ToolMode.AUTO):
        lark = form.grammar(ToolRequest((WEATHER,), mode), special=tags)
        assert takes(compiled(tokenizer, lark), tagged)
        assert takes(compiled(tokenizer, lark), [*tagged, *tokenizer.tokenize_str("\n"), *tagged])
        assert not takes(compiled(tokenizer, lark), spelled)
    auto = form.grammar(ToolRequest((WEATHER,), ToolMode.AUTO), special=tags)
    assert takes(compiled(tokenizer, auto), [*tokenizer.tokenize_str("Let me check.\n"), *tagged])


def test_qwen_thinking_between_special_tokens_then_a_constrained_answer(
    qwen: tuple[llguidance.LLTokenizer, dict[str, int]],
) -> None:
    tokenizer, special = qwen
    tags = {tag: special[tag] for tag in REASONING_TAGS}
    lark = REASONING_FORMATS["qwen3"].after_thinking(grammar_for(GuideType.JSON, None), tags)
    answer = tokenizer.tokenize_str('{"a": 1}')
    thinking = [tags["<think>"], *tokenizer.tokenize_str("Hmm, {not json"), tags["</think>"]]
    built = llguidance.LLMatcher(tokenizer, lark, log_level=0)
    assert not built.is_error(), built.get_error()
    assert takes(built, [*thinking, *answer])
    assert takes(llguidance.LLMatcher(tokenizer, lark, log_level=0), answer)  # thinking is optional under qwen3
    assert not takes(llguidance.LLMatcher(tokenizer, lark, log_level=0), [*thinking, *tokenizer.tokenize_str("hi")])
