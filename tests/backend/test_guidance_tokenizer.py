"""Text a constraint requires is text: produced as text tokens, never as the special token it spells.

Against the real SmolLM2 tokenizer (whose ``<|im_end|>`` is also its end token) and Llama 3.2's.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import pytest

from backend.guidance_tokenizer import control_tokens, guidance_tokenizer
from backend.output_grammar import OutputGrammar
from llgtriton.guides import grammar_for
from llgtriton.wire import GuideType
from tests.backend.llama_tokenizer import llama_tokenizer


@pytest.fixture(scope="module")
def smollm(tokenizer: Any) -> tuple[Any, llguidance.LLTokenizer]:
    return tokenizer, guidance_tokenizer(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def allowed(tokenizer: llguidance.LLTokenizer, matcher: llguidance.LLMatcher) -> list[int]:
    mask = np.zeros((1, (tokenizer.vocab_size + 31) // 32), dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
    return [int(t) for t in np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))]


def write(hf: Any, tokenizer: llguidance.LLTokenizer, grammar: str) -> tuple[str, list[int]]:
    """The output a model writes when it always takes the lowest allowed token, until the grammar ends."""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    tokens: list[int] = []
    for _ in range(200):
        options = allowed(tokenizer, matcher)
        text_options = [t for t in options if t not in tokenizer.eos_tokens]
        if not text_options:
            assert matcher.is_accepting()
            return hf.decode(tokens), tokens
        tokens.append(text_options[0])
        assert matcher.consume_token(tokens[-1]), matcher.get_error()
    raise AssertionError("the grammar never ended")


SPELLED = ["<|im_end|>", "<|im_start|>", "<repo_name>", "<filename>"]


@pytest.mark.parametrize("spelled", SPELLED)
def test_a_regex_spelling_a_special_token_gets_its_text(
    smollm: tuple[Any, llguidance.LLTokenizer], spelled: str
) -> None:
    hf, tokenizer = smollm
    regex = "a" + spelled.replace("|", "\\|") + "b"
    text, tokens = write(hf, tokenizer, grammar_for(GuideType.REGEX, regex))
    assert text == f"a{spelled}b"
    assert not set(tokens) & set(control_tokens(hf).values())


@pytest.mark.parametrize(
    ("kind", "guide", "expected"),
    [
        (GuideType.JSON_SCHEMA, {"const": "<|im_end|>"}, "<|im_end|>"),
        (
            GuideType.JSON_SCHEMA,
            {
                "type": "object",
                "properties": {"<|im_end|>": {"const": 1}},
                "required": ["<|im_end|>"],
                "additionalProperties": False,
            },
            {"<|im_end|>": 1},
        ),
        (GuideType.CHOICE, ["x<|im_end|>"], None),
        (GuideType.LARK, 'start: "a<|im_start|>b"', None),
    ],
    ids=["const", "property", "choice", "lark"],
)
def test_every_constraint_kind_writes_the_spelling_as_text(
    smollm: tuple[Any, llguidance.LLTokenizer], kind: GuideType, guide: Any, expected: Any
) -> None:
    hf, tokenizer = smollm
    text, tokens = write(hf, tokenizer, grammar_for(kind, guide if isinstance(guide, str) else json.dumps(guide)))
    if kind is GuideType.JSON_SCHEMA:
        assert json.loads(text) == expected
    else:
        assert text in ("x<|im_end|>", "a<|im_start|>b")
    assert not set(tokens) & set(control_tokens(hf).values())


def test_llama_3_end_of_turn_in_a_regex_is_text() -> None:
    hf = llama_tokenizer()
    tokenizer = guidance_tokenizer(hf, len(hf), [128001, 128008, 128009])
    text, tokens = write(hf, tokenizer, grammar_for(GuideType.REGEX, r"a<\|eot_id\|>b"))
    assert text == "a<|eot_id|>b" and 128009 not in tokens


def test_masks_are_llguidances_own_where_no_special_token_is_spelled(
    smollm: tuple[Any, llguidance.LLTokenizer],
) -> None:
    """The same token table and special tokens: only the tokenizing of spelled-out special tokens differs."""
    hf, ours = smollm
    theirs = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=[hf.eos_token_id])
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    rng = np.random.default_rng(7)
    for kind, guide in [(GuideType.JSON_SCHEMA, json.dumps(schema)), (GuideType.REGEX, r"[a-z]+ \d{3}-\d{4}")]:
        grammar = grammar_for(kind, guide)
        for _ in range(5):
            mine, other = (llguidance.LLMatcher(t, grammar, log_level=0) for t in (ours, theirs))
            for _ in range(30):
                options = allowed(ours, mine)
                assert options == allowed(theirs, other)
                token = int(rng.choice(options))
                if token in ours.eos_tokens:
                    break
                assert mine.consume_token(token) and other.consume_token(token)


def test_the_output_grammar_says_which_texts_are_complete(smollm: tuple[Any, llguidance.LLTokenizer]) -> None:
    _, tokenizer = smollm
    matcher = llguidance.LLMatcher(tokenizer, grammar_for(GuideType.JSON_SCHEMA, json.dumps({"type": "object"})))
    grammar = OutputGrammar(matcher.is_accepting, matcher.deep_copy(), tokenizer, {})
    assert grammar.completes('{"a": "}"}')
    assert not grammar.completes('{"a": "')
    assert not grammar.complete()  # nothing written yet
