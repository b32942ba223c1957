"""llguidance through the logits post-processor, with the real model and the step scheduler."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import jsonschema
import llguidance.numpy
import pytest
import torch

from backend.chat_template import ChatTemplate
from backend.constraints import Guidance, GuidanceLogitsProcessor
from backend.errors import InvalidRequest, Unavailable
from backend.grammar_cache import GrammarCache, GrammarCopy
from backend.requests import EngineRequest, SamplingParams
from backend.scheduler import Scheduler
from backend.torch_engine import TorchEngine
from llgtriton.guides import CompilerBusy, grammar_for, on_compile_thread
from llgtriton.messages import ChatMessage
from llgtriton.wire import FinishReason, GrammarPressure, GuideType, constraint_refusal
from tests.backend.recording import run as generate
from tests.support.harness import RecordingSink

GREEDY = SamplingParams(temperature=0.0)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def guidance(loaded_model: Any) -> Guidance:
    processor = GuidanceLogitsProcessor.for_tokenizer(
        loaded_model.tokenizer, loaded_model.model.config.vocab_size, loaded_model.eos_token_ids, 4
    )
    return Guidance.for_processor(processor)


@pytest.fixture
def scheduler(loaded_model: Any, guidance: Guidance) -> Iterator[Scheduler]:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    running = Scheduler(
        engine,
        loaded_model.tokenizer,
        loaded_model.eos_token_ids,
        max_batch_size=4,
        max_model_len=1024,
        guidance=guidance,
        token_bytes=lambda token: bytes(guidance.processor.tokenizer.decode_bytes([token])),
    )
    running.start()
    yield running
    running.shutdown()


def chat(loaded_model: Any, text: str) -> tuple[int, ...]:
    return tuple(ChatTemplate(loaded_model.tokenizer).render([ChatMessage("user", text)]))


def constrained(
    prompt: tuple[int, ...], guide_type: GuideType, guide: str | None, max_tokens: int = 120
) -> EngineRequest:
    return EngineRequest("c", prompt, max_tokens, GREEDY, grammar=grammar_for(guide_type, guide))


def test_llguidance_ends_sequences_with_the_engines_eos(loaded_model: Any, guidance: Guidance) -> None:
    assert set(guidance.processor.tokenizer.eos_tokens) == set(loaded_model.eos_token_ids)
    assert guidance.processor.tokenizer.vocab_size == loaded_model.model.config.vocab_size


def test_any_json_object(scheduler: Scheduler, loaded_model: Any) -> None:
    prompt = chat(loaded_model, "Describe a cat as a JSON object with its name and age.")
    (sink,) = generate(scheduler, constrained(prompt, GuideType.JSON, None))
    assert isinstance(json.loads(sink.text), dict)
    assert sink.outputs[-1].finish_reason == FinishReason.STOP


def test_json_schema_output_validates(scheduler: Scheduler, loaded_model: Any) -> None:
    prompt = chat(loaded_model, "Give me JSON for a person named Ann aged 31.")
    (sink,) = generate(scheduler, constrained(prompt, GuideType.JSON_SCHEMA, json.dumps(PERSON)))
    assert sink.error is None
    jsonschema.validate(json.loads(sink.text), PERSON)
    assert sink.outputs[-1].finish_reason == FinishReason.STOP


ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
SENTENCE = 'start: "The answer is " NUMBER "."\nNUMBER: /[0-9]+/'


def _matches(pattern: str) -> Any:
    return lambda text: re.fullmatch(pattern, text) is not None


def _one_of(*choices: str) -> Any:
    return lambda text: text in choices


def _answer(text: str) -> bool:
    return isinstance(json.loads(text)["answer"], int)


@pytest.mark.parametrize(
    ("guide_type", "guide", "check"),
    [
        (GuideType.REGEX, r"\d{3}-\d{4}", _matches(r"\d{3}-\d{4}")),
        (GuideType.CHOICE, json.dumps(["yes", "no"]), _one_of("yes", "no")),
        (GuideType.JSON, json.dumps(ANSWER), _answer),
        (GuideType.LARK, SENTENCE, _matches(r"The answer is [0-9]+\.")),
        (GuideType.EBNF_GRAMMAR, 'root ::= "red" | "green" | "blue"', _one_of("red", "green", "blue")),
    ],
)
def test_every_format_constrains_the_output(
    scheduler: Scheduler, loaded_model: Any, guide_type: GuideType, guide: str | None, check: Any
) -> None:
    (sink,) = generate(
        scheduler, constrained(chat(loaded_model, "Answer briefly: what is 6 times 7?"), guide_type, guide)
    )
    assert sink.error is None
    assert check(sink.text), sink.text
    assert sink.outputs[-1].finish_reason == FinishReason.STOP


def test_max_tokens_inside_the_json_is_length_not_stop(scheduler: Scheduler, loaded_model: Any) -> None:
    prompt = chat(loaded_model, "Give me JSON for a person named Ann aged 31.")
    (sink,) = generate(scheduler, constrained(prompt, GuideType.JSON_SCHEMA, json.dumps(PERSON), max_tokens=4))
    assert sink.outputs[-1].finish_reason == FinishReason.LENGTH
    assert sink.outputs[-1].completion_tokens == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(sink.text)


def test_unconstrained_neighbours_are_not_affected(scheduler: Scheduler, loaded_model: Any) -> None:
    free = EngineRequest("free", chat(loaded_model, "Name three colours."), 24, GREEDY)
    (alone,) = generate(scheduler, free)
    person = constrained(chat(loaded_model, "JSON for Bob, 40."), GuideType.JSON_SCHEMA, json.dumps(PERSON))
    together, json_sink = generate(scheduler, free, person)
    assert together.text == alone.text
    jsonschema.validate(json.loads(json_sink.text), PERSON)


def test_requests_joining_and_leaving_mid_stream_stay_valid(scheduler: Scheduler, loaded_model: Any) -> None:
    """Six constrained requests through a batch of four: masks computed ahead must follow the joins."""
    names = ["Ann", "Bob", "Cid", "Dee", "Eve", "Fay"]
    requests = [
        constrained(chat(loaded_model, f"JSON for {name}, {20 + i}."), GuideType.JSON_SCHEMA, json.dumps(PERSON))
        for i, name in enumerate(names)
    ]
    for sink in generate(scheduler, *requests):
        assert sink.error is None
        jsonschema.validate(json.loads(sink.text), PERSON)
    assert scheduler.load() == (0, 0)


def test_a_matcher_error_ends_only_its_own_request(scheduler: Scheduler, loaded_model: Any) -> None:
    tokenizer = loaded_model.tokenizer
    (letter,) = tokenizer.encode("x", add_special_tokens=False)

    def force_letter(
        req_id: int, logits: torch.Tensor, token_ids: list[list[int]], stream_ptr: int, client_id: int | None
    ) -> None:
        logits.fill_(0.0)  # undo the grammar's mask: the next token breaks the grammar
        logits[..., letter] = 100.0

    broken = EngineRequest(
        "broken",
        chat(loaded_model, "A number please"),
        20,
        GREEDY,
        grammar=grammar_for(GuideType.REGEX, "[0-9]+"),
        logits_processor=force_letter,
    )
    healthy = constrained(chat(loaded_model, "Give me JSON for Ann, 31."), GuideType.JSON_SCHEMA, json.dumps(PERSON))
    failed, fine = generate(scheduler, broken, healthy)
    assert failed.error is not None and "rejected a token" in str(failed.error)
    assert fine.error is None
    jsonschema.validate(json.loads(fine.text), PERSON)
    assert scheduler.load() == (0, 0)


def test_grammars_are_compiled_once(guidance: Guidance) -> None:
    cache = GrammarCache(guidance.processor.tokenizer)
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps({"type": "array", "items": {"type": "number"}}))
    first, second = cache.matcher(grammar), cache.matcher(grammar)
    assert cache.compilations == 1
    assert first is not second  # each request gets its own matcher state
    assert first.consume_tokens(guidance.processor.tokenizer.tokenize_str("[1")) and not second.is_error()


def _mask_of(tokenizer: Any, matcher: Any) -> list[int]:
    mask = torch.zeros((1, (tokenizer.vocab_size + 31) // 32), dtype=torch.int32)
    llguidance.numpy.fill_next_token_bitmask(matcher, mask.numpy(), 0)
    return mask[0].tolist()


def test_a_grammar_in_use_is_handed_out_across_lanes_whose_copies_mask_alike(guidance: Guidance) -> None:
    """Copies of one template wait for each other's lock in llguidance: a grammar requests keep using is
    compiled again aside, up to ``lanes`` times, and every copy behaves as a fresh matcher."""
    tokenizer = guidance.processor.tokenizer
    cache = GrammarCache(tokenizer, lanes=3)
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))
    copies = [cache.copy(grammar)]
    deadline = time.monotonic() + 60
    while {copy.lane for copy in copies} != {0, 1, 2} and time.monotonic() < deadline:
        copies.append(cache.copy(grammar))
        time.sleep(0.01)
    assert {copy.lane for copy in copies} == {0, 1, 2}
    assert cache.compilations == 1  # the spares are compiled aside, never on a request's path
    prefix = tokenizer.tokenize_str('{"name": "Ann')
    moved = copies[-1].matcher
    assert moved.consume_tokens(prefix)
    others = [copy.matcher for copy in copies[:-1]]
    assert all(_mask_of(tokenizer, m) == _mask_of(tokenizer, others[0]) for m in others)  # untouched by `moved`
    by_lane = {copy.lane: copy.matcher for copy in copies[:-1]}
    for matcher in by_lane.values():
        assert matcher.consume_tokens(prefix)
        assert _mask_of(tokenizer, matcher) == _mask_of(tokenizer, moved)


def allowed_tokens(bits: list[int], width: int) -> list[int]:
    return [token for token in range(width) if bits[token >> 5] >> (token & 31) & 1]


def check_masked_from_the_first_mask_on(
    processor: GuidanceLogitsProcessor,
    copy: GrammarCopy,
    grammar: str,
    width: int,
    client_id: int,
    *,
    first_step: AbstractContextManager[object] | None = None,
) -> None:
    """A request added with its grammar's first mask gets it at its first step (masked inside
    ``first_step``), and at the next the mask of where its token moved it, as a matcher of its own
    computes them."""
    tokenizer = processor.tokenizer
    reference = llguidance.LLMatcher(tokenizer, grammar)
    processor.add(client_id, copy.matcher, 0, copy.lane, grammar=grammar, first_mask=copy.first_mask)
    try:
        for step in range(2):
            logits = torch.zeros(1, width)
            with first_step if first_step is not None and step == 0 else nullcontext():
                processor.mask(logits, [client_id], 0)
            expected = allowed_tokens(_mask_of(tokenizer, reference), width)
            assert torch.isfinite(logits[0]).nonzero().view(-1).tolist() == expected
            token = next(token for token in expected if token not in tokenizer.eos_tokens)
            assert reference.consume_token(token)
            processor.prefetch([client_id], [token])
    finally:
        processor.remove(client_id)


def test_every_copy_carries_its_grammars_first_mask_which_a_request_starts_with(
    loaded_model: Any, guidance: Guidance
) -> None:
    """A fresh copy's first mask depends on the grammar alone: it is computed once, as the grammar is
    compiled, and a request's first step is masked with it instead of computing it again."""
    tokenizer = guidance.processor.tokenizer
    cache = GrammarCache(tokenizer, lanes=2)
    grammars = [
        grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON)),
        grammar_for(GuideType.REGEX, "(red|green|blue)!{1,3}"),
        grammar_for(GuideType.JSON, None),
    ]
    for grammar in grammars:
        made, cached = cache.copy(grammar), cache.copy(grammar)
        assert made.first_mask is not None and cached.first_mask is not None
        fresh = _mask_of(tokenizer, llguidance.LLMatcher(tokenizer, grammar))
        assert made.first_mask.tolist() == cached.first_mask.tolist() == fresh
    width = loaded_model.model.config.vocab_size
    check_masked_from_the_first_mask_on(guidance.processor, cache.copy(grammars[0]), grammars[0], width, 2100)


def test_a_spare_that_fails_to_compile_leaves_the_grammar_on_the_lanes_it_has(
    guidance: Guidance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare is given up (compile slots busy, a timeout under load), never retried on every request."""
    attempts: list[int] = []

    def first_only(work: Any, *args: Any, **kwargs: Any) -> Any:
        attempts.append(1)
        if len(attempts) > 1:
            raise CompilerBusy("4 constraints are compiling already")
        return on_compile_thread(work, *args, **kwargs)

    monkeypatch.setattr("backend.grammar_cache.on_compile_thread", first_only)
    cache = GrammarCache(guidance.processor.tokenizer, lanes=4)
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))
    copies = [cache.copy(grammar)]
    for _ in range(20):
        copies.append(cache.copy(grammar))
        time.sleep(0.01)
    assert {copy.lane for copy in copies} == {0}
    assert len(attempts) == 2  # the request's compile and one spare, given up
    assert copies[-1].matcher.consume_tokens(guidance.processor.tokenizer.tokenize_str('{"name": "A'))


def test_a_grammar_readied_ahead_gets_a_spare_only_once_a_second_request_uses_it(
    guidance: Guidance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mask process readies each grammar before its request is added: a schema one request uses is
    compiled once there, not twice (a spare compile would hold one of the few compile slots)."""
    compiles: list[str] = []

    def counted(work: Any, *args: Any, **kwargs: Any) -> Any:
        compiles.append(threading.current_thread().name)
        return on_compile_thread(work, *args, **kwargs)

    monkeypatch.setattr("backend.grammar_cache.on_compile_thread", counted)
    cache = GrammarCache(guidance.processor.tokenizer, lanes=2)
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))
    cache.ready(grammar)
    cache.ready(grammar)  # (readied again: already compiled)
    first = cache.cached_copy(grammar)
    time.sleep(1.0)  # a spare would be compiling by now
    assert first is not None and len(compiles) == 1
    copies = [cache.cached_copy(grammar)]  # a second request: its grammar gets a spare, aside
    deadline = time.monotonic() + 60
    while {copy.lane for copy in copies if copy is not None} != {0, 1} and time.monotonic() < deadline:
        copies.append(cache.cached_copy(grammar))
        time.sleep(0.01)
    assert {copy.lane for copy in copies if copy is not None} == {0, 1}
    assert len(compiles) == 2 and compiles[1].startswith("llgtriton-spare-compile")


def test_rows_of_several_lanes_get_their_own_masks(loaded_model: Any, guidance: Guidance) -> None:
    """The parallel calls take rows lane by lane; each mask must still land in its own row."""
    processor = guidance.processor
    tokenizer = processor.tokenizer
    cache = GrammarCache(tokenizer, lanes=2)
    grammars = [grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON)), grammar_for(GuideType.REGEX, "[0-9]{2,4}")]
    prefixes = ['{"name": "A', '{"name": "Ann", "age": 3', "1", "12"]
    expected: list[list[int]] = []
    for index, prefix in enumerate(prefixes):
        reference = llguidance.LLMatcher(tokenizer, grammars[index // 2])
        assert reference.consume_tokens(tokenizer.tokenize_str(prefix))
        expected.append(_mask_of(tokenizer, reference))
    copies = [cache.copy(grammars[index // 2]) for index in range(len(prefixes))]
    for index, copy in enumerate(copies):
        processor.add(2000 + index, copy.matcher, 0, lane=1 - index % 2)  # lanes 1, 0, 1, 0: out of order
    try:
        for index, prefix in enumerate(prefixes):
            processor.consume(2000 + index, tokenizer.tokenize_str(prefix))
        width = loaded_model.model.config.vocab_size
        logits = torch.zeros(len(prefixes), width)
        processor.mask(logits, [2000 + index for index in range(len(prefixes))], 0)
        for index, row in enumerate(logits):
            allowed = torch.isfinite(row).nonzero().view(-1).tolist()
            bits = expected[index]
            assert allowed == [t for t in range(width) if bits[t >> 5] >> (t & 31) & 1]
    finally:
        for index in range(len(prefixes)):
            processor.remove(2000 + index)


def test_a_grammar_that_does_not_compile_is_an_invalid_request_saying_the_constraint_is_refused(
    guidance: Guidance,
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        GrammarCache(guidance.processor.tokenizer).matcher("start: missing_rule")
    reason = constraint_refusal(str(refused.value))  # how the wire tells the proxy: a 400 naming the field
    assert reason is not None and "unknown name" in reason


def test_the_grammar_cache_is_bounded_by_bytes(guidance: Guidance) -> None:
    grammars = [grammar_for(GuideType.REGEX, f"[a-z]{{{i}}}x{'y' * 400}") for i in range(1, 5)]
    cache = GrammarCache(guidance.processor.tokenizer, max_bytes=2 * max(len(g) for g in grammars))
    for grammar in grammars:
        cache.matcher(grammar)
    kept = [grammar for grammar in grammars if cache.cached_matcher(grammar) is not None]
    assert kept == grammars[-2:]


@pytest.mark.parametrize(
    ("guide_type", "guide", "match"),
    [
        (
            GuideType.REGEX,
            "d{300000}",
            "fails as generation starts",
        ),  # the lexer runs out of expressions at the first mask
        (
            GuideType.LARK,
            "start: " + " | ".join(f'"w{i}"' for i in range(2500)),
            "fails as generation starts",
        ),  # Earley row limit
    ],
)
def test_constraints_that_fail_at_the_first_token_are_refused_at_compile_time_every_time(
    guidance: Guidance, guide_type: GuideType, guide: str, match: str
) -> None:
    """Once the first request's copy had failed, the shared template gave later ones an end-only mask: 'stop', ""."""
    cache = GrammarCache(guidance.processor.tokenizer)
    grammar = grammar_for(guide_type, guide)
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=match) as refused:
            cache.matcher(grammar)
        assert len(str(refused.value)) < 600  # llguidance's message can hold the whole parser state
    assert cache.cached_matcher(grammar) is None


def test_a_matcher_that_fails_while_computing_a_mask_ends_its_request_with_an_error(
    scheduler: Scheduler, loaded_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llguidance leaves an end-only mask when a matcher fails in a fill; the request must not read as 'stop'."""
    real_fill = llguidance.numpy.fill_next_token_bitmask_par

    def failing_fill(executor: Any, matchers: Any, masks: Any) -> None:
        real_fill(executor, matchers, masks)
        for matcher, _ in matchers:
            matcher.consume_token(10**6)  # out of the vocabulary: puts the matcher in its error state

    prompt = chat(loaded_model, "Give me a number.")
    request = constrained(prompt, GuideType.REGEX, "[0-9]{5}", max_tokens=20)
    monkeypatch.setattr(llguidance.numpy, "fill_next_token_bitmask_par", failing_fill)
    (sink,) = generate(scheduler, request)
    assert sink.error is not None and "next mask" in str(sink.error)
    assert all(output.finish_reason is None for output in sink.outputs)


class _GatedCache(GrammarCache):
    """A grammar cache whose compilations wait for a gate and record the thread they ran on."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.gate = threading.Event()
        self.threads: list[str] = []

    def copy(self, grammar: str) -> Any:
        if self.cached_copy(grammar) is None:
            self.threads.append(threading.current_thread().name)
            assert self.gate.wait(60)
        return super().copy(grammar)


def _gated_scheduler(
    loaded_model: Any, processor: GuidanceLogitsProcessor, **kwargs: Any
) -> tuple[Scheduler, _GatedCache]:
    engine = TorchEngine(loaded_model.model, torch.device("cpu"))
    cache = _GatedCache(processor.tokenizer)
    scheduler = Scheduler(
        engine,
        loaded_model.tokenizer,
        loaded_model.eos_token_ids,
        max_batch_size=4,
        max_model_len=1024,
        guidance=Guidance(processor, cache),
        **kwargs,
    )
    return scheduler, cache


def test_new_grammars_compile_off_the_step_loop_which_keeps_serving(loaded_model: Any, guidance: Guidance) -> None:
    scheduler, cache = _gated_scheduler(loaded_model, guidance.processor)
    scheduler.start()
    try:
        prompt = chat(loaded_model, "Describe a person.")
        compiling = RecordingSink()
        scheduler.submit(constrained(prompt, GuideType.JSON_SCHEMA, json.dumps(PERSON)), compiling)
        # While that grammar compiles (held at the gate), an unconstrained request runs to the end.
        (free,) = generate(scheduler, EngineRequest("free", prompt, 5, GREEDY))
        assert free.outputs[-1].completion_tokens == 5
        assert not compiling.done.is_set()
        assert scheduler.load() == (0, 1)  # the compiling request counts as waiting
        cache.gate.set()
        compiling.wait()
        assert compiling.error is None
        jsonschema.validate(json.loads(compiling.text), PERSON)
        assert cache.threads and all(name.startswith("llgtriton-compile") for name in cache.threads)
    finally:
        cache.gate.set()
        scheduler.shutdown()


def test_a_grammar_that_fails_to_compile_fails_only_its_request(scheduler: Scheduler, loaded_model: Any) -> None:
    prompt = chat(loaded_model, "Hi")
    broken = EngineRequest("broken", prompt, 5, GREEDY, grammar="start: missing_rule")
    bad, good = generate(scheduler, broken, EngineRequest("good", prompt, 5, GREEDY))
    assert isinstance(bad.error, InvalidRequest) and "unknown name" in str(bad.error)
    assert good.error is None and good.outputs[-1].completion_tokens == 5


def test_compiling_requests_count_against_the_queue_and_fail_on_shutdown(loaded_model: Any, guidance: Guidance) -> None:
    scheduler, cache = _gated_scheduler(loaded_model, guidance.processor, max_queue_size=2, compile_threads=1)
    prompt = chat(loaded_model, "Hi")
    sinks = [RecordingSink(), RecordingSink()]
    for index, sink in enumerate(sinks):
        schema = json.dumps({"type": "array", "maxItems": index + 1})
        scheduler.submit(constrained(prompt, GuideType.JSON_SCHEMA, schema), sink)
    with pytest.raises(Unavailable, match="queue is full"):
        scheduler.submit(constrained(prompt, GuideType.JSON, None), RecordingSink())
    scheduler.shutdown(timeout=1)  # one compile is held at the gate, one is queued behind it
    cache.gate.set()
    for sink in sinks:
        sink.wait()
        assert isinstance(sink.error, Unavailable)


def test_a_failure_while_consuming_ahead_ends_those_requests_not_the_step(
    loaded_model: Any, guidance: Guidance, monkeypatch: pytest.MonkeyPatch
) -> None:
    processor, cache = guidance.processor, guidance.grammars
    grammar = grammar_for(GuideType.JSON, None)
    processor.add(1001, cache.matcher(grammar), 3)
    processor.add(1002, cache.matcher(grammar), 3)

    def broken(executor: Any, matchers: Any) -> list[bool]:
        raise RuntimeError("llguidance bug")

    monkeypatch.setattr(llguidance.numpy, "consume_token_par", broken)
    (brace,) = loaded_model.tokenizer.encode("{", add_special_tokens=False)
    try:
        processor.prefetch([1001, 1002], [brace, brace])
        logits = torch.zeros(2, loaded_model.model.config.vocab_size)
        processor.mask(logits, [1001, 1002], 0)  # must not raise
        for cid, row in zip((1001, 1002), logits, strict=True):
            assert "llguidance bug" in str(processor.error(cid))
            allowed = torch.isfinite(row.view(-1)).nonzero().view(-1).tolist()
            assert set(allowed) <= set(loaded_model.eos_token_ids)  # only the end remains possible
    finally:
        processor.remove(1001)
        processor.remove(1002)


# Logprobs and logit_bias under a constraint ------------------------------------------------------


def test_logprobs_are_the_distribution_after_the_mask(scheduler: Scheduler, loaded_model: Any) -> None:
    """Only tokens the grammar allows are reported, and they carry all the probability."""
    prompt = chat(loaded_model, "Is the sky blue? Answer yes or no.")
    grammar = grammar_for(GuideType.CHOICE, json.dumps(["yes", "no"]))
    (sink,) = generate(scheduler, EngineRequest("lp", prompt, 8, GREEDY, grammar=grammar, logprobs=20))
    entries = [entry for output in sink.outputs for entry in output.logprobs or ()]
    assert b"".join(entry.token for entry in entries).decode() == sink.text in ("yes", "no")
    first = entries[0]
    assert all(any(choice.startswith(a.token.decode()) for choice in ("yes", "no")) for a in first.top)
    assert sum(math.exp(a.logprob) for a in first.top) == pytest.approx(1.0, abs=1e-4)  # nothing masked kept any
    assert first.top[0].token == first.token and first.top[0].logprob == first.logprob  # greedy took the top
    assert all(entry.logprob <= 0 for entry in entries)


def test_logprobs_without_alternatives(scheduler: Scheduler, loaded_model: Any) -> None:
    prompt = chat(loaded_model, "Say hi.")
    (sink,) = generate(scheduler, EngineRequest("lp0", prompt, 5, GREEDY, logprobs=0, stream=True))
    entries = [entry for output in sink.outputs for entry in output.logprobs or ()]
    assert len(entries) == sink.outputs[-1].completion_tokens - (sink.outputs[-1].finish_reason == FinishReason.STOP)
    assert all(entry.top == () for entry in entries)


def test_no_logprobs_unless_asked(scheduler: Scheduler, loaded_model: Any) -> None:
    (sink,) = generate(scheduler, EngineRequest("none", chat(loaded_model, "Say hi."), 3, GREEDY))
    assert all(output.logprobs is None for output in sink.outputs)


def test_logit_bias_steers_free_text_but_never_lifts_the_mask(
    scheduler: Scheduler, loaded_model: Any, guidance: Guidance
) -> None:
    tokenizer = guidance.processor.tokenizer
    (forced,) = tokenizer.tokenize_str("banana")[:1]
    prompt = chat(loaded_model, "Is the sky blue? Answer yes or no.")
    bias = SamplingParams(temperature=0.0, logit_bias=((forced, 100.0),))
    free, held = generate(
        scheduler,
        EngineRequest("free", prompt, 1, bias),
        EngineRequest("held", prompt, 8, bias, grammar=grammar_for(GuideType.CHOICE, json.dumps(["yes", "no"]))),
    )
    assert tokenizer.tokenize_str(free.text)[:1] == [forced]
    assert held.text in ("yes", "no")


def test_a_request_in_a_mixed_batch_reports_the_pressure_it_reports_alone(
    scheduler: Scheduler, loaded_model: Any
) -> None:
    prompt = chat(loaded_model, "Give me JSON for a person named Ann aged 31.")
    schema = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))

    def person(request_id: str, asks: bool) -> EngineRequest:
        return EngineRequest(request_id, prompt, 40, GREEDY, grammar=schema, grammar_pressure=asks)

    (alone,) = generate(scheduler, person("alone", True))
    # One step's rows: asking and constrained, constrained only, asking and free.
    asking, quiet, free = generate(
        scheduler,
        person("asking", True),
        person("quiet", False),
        EngineRequest("free", prompt, 6, GREEDY, grammar_pressure=True),
    )

    expected, report = alone.outputs[-1].grammar_pressure, asking.outputs[-1].grammar_pressure
    assert expected is not None and report is not None
    assert (report.tokens, report.first_choice_forbidden) == (expected.tokens, expected.first_choice_forbidden)
    assert math.isclose(report.mean_removed, expected.mean_removed, abs_tol=1e-4)
    assert math.isclose(report.max_removed, expected.max_removed, abs_tol=1e-4)
    assert 0.0 < report.mean_removed <= report.max_removed <= 1.0
    assert quiet.outputs[-1].grammar_pressure is None
    assert free.outputs[-1].grammar_pressure == GrammarPressure(6, 0.0, 0.0, 0)


def test_masks_computed_on_the_step_loop_give_the_outputs_the_worker_gives(
    scheduler: Scheduler, loaded_model: Any
) -> None:
    prompts = [chat(loaded_model, f"Give me JSON for a person named {name}.") for name in ("Ann", "Bob", "Cyd")]
    schema = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))

    def outputs() -> list[str]:
        requests = [EngineRequest(f"p{i}", prompt, 40, GREEDY, grammar=schema) for i, prompt in enumerate(prompts)]
        return [sink.text for sink in generate(scheduler, *requests)]

    scheduler.masks_on_loop_rows = 0
    on_worker = outputs()
    scheduler.masks_on_loop_rows = len(prompts)
    try:
        on_step_loop = outputs()
    finally:
        scheduler.masks_on_loop_rows = 0
    assert on_step_loop == on_worker
    for text in on_step_loop:
        jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("masks_on_loop_rows", [0, 4], ids=["masks on the worker", "masks on the step loop"])
def test_decode_passes_launched_ahead_give_the_outputs_of_a_step_at_a_time(
    scheduler: Scheduler, loaded_model: Any, masks_on_loop_rows: int
) -> None:
    """Six constrained requests and a free one through a batch of four, one ended early by a stop
    string: each step's decode queued before its tokens are delivered changes no output, whichever
    thread computes the masks."""
    names = ["Ann", "Bob", "Cid", "Dee", "Eve", "Fay"]
    schema = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))

    def outputs() -> list[str]:
        requests = [
            EngineRequest(f"p{i}", chat(loaded_model, f"JSON for {name}, {20 + i}."), 60, GREEDY, grammar=schema)
            for i, name in enumerate(names)
        ]
        stopped = EngineRequest("s", chat(loaded_model, "Tell me a story."), 40, GREEDY, stop=(" talented",))
        return [sink.text for sink in generate(scheduler, stopped, *requests)]

    one_at_a_time = outputs()
    scheduler.launch_ahead, scheduler.masks_on_loop_rows = True, masks_on_loop_rows
    try:
        launched_ahead = outputs()
    finally:
        scheduler.launch_ahead, scheduler.masks_on_loop_rows = False, 0
    assert launched_ahead == one_at_a_time
    assert " talented" not in launched_ahead[0] and launched_ahead[0]
    for text in launched_ahead[1:]:
        jsonschema.validate(json.loads(text), PERSON)
    assert scheduler.load() == (0, 0)
