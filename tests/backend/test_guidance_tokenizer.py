"""Text a constraint requires is text: produced as text tokens, never as the special token it spells.

Against the real SmolLM2 tokenizer (whose ``<|im_end|>`` is also its end token) and Llama 3.2's.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import llguidance
import llguidance.hf
import llguidance.numpy
import numpy as np
import pytest
from tokenizers import normalizers

from backend.grammar_cache import GrammarCache
from backend.guidance_tokenizer import control_tokens, guidance_tokenizer, guidance_tokenizers
from backend.output_grammar import OutputGrammar
from llgtriton.guides import grammar_for, json_schema_grammar
from llgtriton.wire import GuideType
from tests.backend.llama_tokenizer import llama_tokenizer


@pytest.fixture(scope="module")
def smollm(tokenizer: Any) -> tuple[Any, llguidance.LLTokenizer]:
    return tokenizer, guidance_tokenizer(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


def allowed(tokenizer: llguidance.LLTokenizer, matcher: llguidance.LLMatcher) -> list[int]:
    mask = np.zeros((1, (tokenizer.vocab_size + 31) // 32), dtype=np.int32)
    llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0)
    return [int(t) for t in np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))]


def write(
    hf: Any, tokenizer: llguidance.LLTokenizer, grammar: str, matcher: llguidance.LLMatcher | None = None
) -> tuple[str, list[int]]:
    """The output a model writes when it always takes the lowest allowed token, until the grammar ends."""
    matcher = matcher or llguidance.LLMatcher(tokenizer, grammar, log_level=0)
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


@pytest.fixture(scope="module")
def smollm_both(tokenizer: Any) -> tuple[Any, Any]:
    return tokenizer, guidance_tokenizers(tokenizer, len(tokenizer), [tokenizer.eos_token_id])


@pytest.mark.parametrize(
    "schema",
    [
        {"const": "<|im_end|>"},
        {"enum": ["a", "b>"]},
        {"type": "object", "properties": {"a>": {"type": "integer"}}, "required": ["a>"]},
        {"type": "string", "pattern": "^[=-?]$"},  # a range holding '>' without spelling it
        {"type": "object", "patternProperties": {"^x": {"const": 1}}},
        {"$defs": {"a>b": {"type": "integer"}}, "$ref": "#/$defs/a>b"},
    ],
)
def test_a_schema_that_could_force_a_spellings_end_reads_forced_text_as_text(
    smollm_both: tuple[Any, Any], schema: Any
) -> None:
    _, tokenizers = smollm_both
    assert tokenizers.plain is not None  # SmolLM2's added tokens all end in '>'
    assert not tokenizers.plain.reads_plainly(json_schema_grammar(schema))


@pytest.mark.parametrize("depth", [900, 3000])  # walked, and too deep for Python's parser
def test_a_schema_nested_past_what_can_be_walked_reads_forced_text_as_text(
    smollm_both: tuple[Any, Any], depth: int
) -> None:
    _, tokenizers = smollm_both
    schema = '{"items":' * depth + '{"const": "a>"}' + "}" * depth
    assert not tokenizers.plain.reads_plainly('{"grammars":[{"json_schema":' + schema + "}]}")


def test_a_lark_or_regex_grammar_reads_forced_text_as_text(smollm_both: tuple[Any, Any]) -> None:
    _, tokenizers = smollm_both
    assert not tokenizers.plain.reads_plainly(grammar_for(GuideType.REGEX, "[a-z]+"))
    assert not tokenizers.plain.reads_plainly(grammar_for(GuideType.LARK, 'start: "a"'))


def test_the_grammar_cache_writes_a_spelled_special_token_as_text_with_both_tokenizers(
    smollm_both: tuple[Any, Any],
) -> None:
    hf, tokenizers = smollm_both
    cache = GrammarCache(tokenizers.text, plain_tokenizer=tokenizers.plain)
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps({"const": "x<|im_end|>"}))
    text, tokens = write(hf, tokenizers.text, grammar, cache.matcher(grammar))
    assert json.loads(text) == "x<|im_end|>"
    assert not set(tokens) & set(control_tokens(hf).values())


PLAIN_SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"],
    },
    {"type": "array", "items": {"type": "number", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}, "required": ["when"]},
    {"type": "object", "properties": {"mail": {"type": "string", "format": "email"}, "n": {"type": "boolean"}}},
    {"enum": ["red", "green", {"mixed": [1, 2]}, None]},
    {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "object", "properties": {"k": {"const": "v"}}}]},
    {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"enum": ["a b", "c:d", "<e"]}}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"},
]


def test_schemas_that_read_plainly_get_the_same_masks_and_forced_tokens_from_both_tokenizers(
    smollm_both: tuple[Any, Any],
) -> None:
    """llguidance's own tokenizer serves the schemas that never force a spelling's end: along random
    walks, its masks and forced tokens are the text-reading one's."""
    _, tokenizers = smollm_both
    plain = tokenizers.plain
    rng = np.random.default_rng(51)
    for schema in PLAIN_SCHEMAS:
        grammar = json_schema_grammar(schema)
        assert plain.reads_plainly(grammar), schema
        for _ in range(3):
            mine, other = (llguidance.LLMatcher(t, grammar, log_level=0) for t in (tokenizers.text, plain.tokenizer))
            for _ in range(30):
                options = allowed(tokenizers.text, mine)
                assert options == allowed(plain.tokenizer, other)
                assert mine.compute_ff_tokens() == other.compute_ff_tokens()
                token = int(rng.choice(options))
                if token in tokenizers.text.eos_tokens:
                    break
                assert mine.consume_token(token) and other.consume_token(token)


def test_a_vocabulary_with_a_spelling_not_ending_in_a_bracket_reads_every_grammar_as_text(tokenizer: Any) -> None:
    """Where a spelling ends in a character JSON itself forces (Mistral's ``[/INST]``), nothing reads plainly."""
    widened = copy.deepcopy(tokenizer)
    widened.add_tokens(["[/INST]"], special_tokens=True)
    assert guidance_tokenizers(widened, len(widened), [widened.eos_token_id]).plain is None


def test_a_normalizer_that_could_make_a_spellings_end_reads_every_grammar_as_text(tokenizer: Any) -> None:
    """NFKC turns the fullwidth U+FF1E into '>': a spelling could then end where the grammar forced no '>'."""
    normalizing = copy.deepcopy(tokenizer)
    normalizing.backend_tokenizer.normalizer = normalizers.NFKC()
    assert guidance_tokenizers(normalizing, len(normalizing), [normalizing.eos_token_id]).plain is None
