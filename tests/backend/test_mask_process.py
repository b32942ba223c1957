"""The matchers in a process of their own (``--engine-mask-process``): the same outputs as the engine's
own mask threads, a killed mask process ending only the requests it constrained, and no orphan."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch

from backend.constraints import Guidance, GuidanceLogitsProcessor
from backend.errors import Unavailable
from backend.guidance_tokenizer import guidance_tokenizers
from backend.mask_process import MaskProcess
from backend.masking import CpuBitmaskApplier
from backend.requests import EngineRequest, SamplingParams
from backend.scheduler import Scheduler
from backend.torch_engine import TorchEngine
from llgtriton.guides import grammar_for
from llgtriton.wire import FinishReason, GuideType
from tests.backend.recording import run as generate
from tests.backend.test_constraints import PERSON, chat, check_masked_from_the_first_mask_on
from tests.support.harness import RecordingSink

GREEDY = SamplingParams(temperature=0.0)
ROWS = 4


def processor_for(
    loaded_model: Any, source: MaskProcess | None, applier: CpuBitmaskApplier | None = None
) -> GuidanceLogitsProcessor:
    vocab = loaded_model.model.config.vocab_size
    tokenizers = guidance_tokenizers(loaded_model.tokenizer, vocab, loaded_model.eos_token_ids)
    return GuidanceLogitsProcessor(
        tokenizers.text, vocab, ROWS, plain_tokenizer=tokenizers.plain, source=source, applier=applier
    )


@pytest.fixture(scope="module")
def mask_process(loaded_model: Any) -> Iterator[MaskProcess]:
    vocab = loaded_model.model.config.vocab_size
    process = MaskProcess(loaded_model.tokenizer, vocab, tuple(loaded_model.eos_token_ids), ROWS, 2)
    yield process
    process.close()


def scheduler_for(loaded_model: Any, processor: GuidanceLogitsProcessor, **options: Any) -> Scheduler:
    guidance = Guidance.for_processor(processor)
    running = Scheduler(
        TorchEngine(loaded_model.model, torch.device("cpu")),
        loaded_model.tokenizer,
        loaded_model.eos_token_ids,
        max_batch_size=ROWS,
        max_model_len=1024,
        guidance=guidance,
        token_bytes=lambda token: bytes(processor.tokenizer.decode_bytes([token])),
        **options,
    )
    running.start()
    return running


def batch(loaded_model: Any) -> list[EngineRequest]:
    """A free request beside three constraints of different kinds, run together."""
    person = chat(loaded_model, "Give me JSON for a person named Ann aged 31.")
    colour = chat(loaded_model, "Name a colour.")
    return [
        EngineRequest("schema", person, 60, GREEDY, grammar=grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))),
        EngineRequest("regex", colour, 12, GREEDY, grammar=grammar_for(GuideType.REGEX, "(red|green|blue)!{1,3}")),
        EngineRequest("free", colour, 12, GREEDY),
        EngineRequest("choice", colour, 12, GREEDY, grammar=grammar_for(GuideType.CHOICE, '["yes", "no"]')),
    ]


def test_outputs_are_the_same_with_the_masks_in_a_process(loaded_model: Any, mask_process: MaskProcess) -> None:
    """The same outputs from the engine's threads, a mask process writing masks of its own (copied),
    one writing straight into the applier's shared buffer, and three sharing the step's rows; launched
    ahead, as on CUDA (a mask process takes a step's tokens the same way either way)."""
    vocab = loaded_model.model.config.vocab_size
    eos = tuple(loaded_model.eos_token_ids)
    shared = CpuBitmaskApplier(vocab, ROWS, shared=True)
    writing_in = MaskProcess(loaded_model.tokenizer, vocab, eos, ROWS, 2, shared=shared.shared_masks())
    split = CpuBitmaskApplier(vocab, ROWS, shared=True)
    three = MaskProcess(loaded_model.tokenizer, vocab, eos, ROWS, 3, processes=3, shared=split.shared_masks())
    texts = {}
    setups = (
        ("threads", None, None),
        ("process", mask_process, None),
        ("shared", writing_in, shared),
        ("three", three, split),
    )
    for name, source, applier in setups:
        processor = processor_for(loaded_model, source, applier)
        scheduler = scheduler_for(loaded_model, processor, launch_ahead=True)
        try:
            sinks = generate(scheduler, *batch(loaded_model))
        finally:
            scheduler.shutdown()
        assert [sink.error for sink in sinks] == [None] * 4
        texts[name] = [sink.text for sink in sinks]
    writing_in.close()
    three.close()
    assert texts["process"] == texts["threads"]
    assert texts["shared"] == texts["threads"]
    assert texts["three"] == texts["threads"]
    schema, regex, _, choice = texts["process"]
    jsonschema.validate(json.loads(schema), PERSON)
    assert regex.rstrip("!") in {"red", "green", "blue"} and regex.endswith("!")
    assert choice in {"yes", "no"}


def test_a_joining_request_gets_its_first_mask_without_waiting_for_the_mask_process(
    loaded_model: Any, mask_process: MaskProcess
) -> None:
    """Its grammar's first mask is known on the engine's side: the row is masked while the child is
    stopped (no round trip), and once it runs again the request's next masks come from it."""
    processor = processor_for(loaded_model, mask_process)
    grammar = grammar_for(GuideType.JSON_SCHEMA, json.dumps(PERSON))
    copy = Guidance.for_processor(processor).grammars.copy(grammar)
    width = loaded_model.model.config.vocab_size
    computing = mask_process.compute_seconds
    check_masked_from_the_first_mask_on(processor, copy, grammar, width, 4000, first_step=stopped(mask_process.pid))
    assert mask_process.compute_seconds > computing  # (the second step's mask, as the child reports its time)


def test_a_wave_of_joining_requests_never_waits_for_the_mask_process_to_read(
    loaded_model: Any, mask_process: MaskProcess
) -> None:
    """Their grammars (here 64 of 200 kB) are more than the socket holds while the child is busy: the
    step loop leaves what the socket does not take to a writer and goes on, and the child reads it
    all, in order, once it runs again."""
    processor = processor_for(loaded_model, mask_process)
    grammars = Guidance.for_processor(processor).grammars
    grammar = 'start: COLOUR\nCOLOUR: ("red" | "blue")\n// ' + "x" * 200_000 + "\n"
    joining = range(5000, 5064)
    with stopped(mask_process.pid):
        for cid in joining:
            copy = grammars.copy(grammar)
            processor.add(cid, copy.matcher, 0, copy.lane, grammar=grammar, first_mask=copy.first_mask)
        assert copy.first_mask is not None
        first_token = int(np.flatnonzero(np.unpackbits(copy.first_mask.view(np.uint8), bitorder="little"))[0])
        processor.prefetch([joining[0]], [first_token])  # (sends the joining requests, then the step)
    try:
        assert not processor.is_accepting(joining[-1])  # (a round trip behind all of them)
        width = loaded_model.model.config.vocab_size
        check_masked_from_the_first_mask_on(processor, grammars.copy(grammar), grammar, width, 5100)
    finally:
        for cid in joining:
            processor.remove(cid)


def test_an_end_token_is_checked_without_asking_the_mask_process(loaded_model: Any, mask_process: MaskProcess) -> None:
    """The reply with a request's next mask says whether its output so far is complete, so the step
    that samples an end token does not wait for the child's answer (stopped here)."""
    processor = processor_for(loaded_model, mask_process)
    grammar = grammar_for(GuideType.REGEX, "(red|green|blue)!{1,3}")
    copy = Guidance.for_processor(processor).grammars.copy(grammar)
    width = loaded_model.model.config.vocab_size
    tokenize = processor.tokenizer.tokenize_str
    processor.add(6000, copy.matcher, 0, copy.lane, grammar=grammar, first_mask=copy.first_mask)
    try:
        for text, complete in (("red", False), ("!", True)):
            for token in tokenize(text):
                processor.mask(torch.zeros(1, width), [6000], 0)
                processor.prefetch([6000], [token])
            processor.mask(torch.zeros(1, width), [6000], 0)  # (its reply is in)
            with stopped(mask_process.pid):
                assert processor.is_accepting(6000) is complete
    finally:
        processor.remove(6000)


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The process stopped for the block, which must end before a timer resumes it (20 s): it waited
    for nothing from it."""
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(20, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        yield
        assert resume.is_alive(), "the step waited for the stopped mask process"
    finally:
        resume.cancel()
        os.kill(pid, signal.SIGCONT)


def wait_until(condition: Any) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "it never happened"
        time.sleep(0.01)


def test_a_killed_mask_process_ends_only_its_requests_and_the_next_grammar_starts_another(
    loaded_model: Any,
) -> None:
    vocab = loaded_model.model.config.vocab_size
    source = MaskProcess(loaded_model.tokenizer, vocab, tuple(loaded_model.eos_token_ids), ROWS, 2)
    scheduler = scheduler_for(loaded_model, processor_for(loaded_model, source))
    try:
        prompt = chat(loaded_model, "Write a long story about a cat.")
        long_text = grammar_for(GuideType.REGEX, "[a-z ]{3000}")
        constrained, free = RecordingSink(), RecordingSink()
        scheduler.submit(EngineRequest("c", prompt, 500, GREEDY, grammar=long_text), constrained)
        scheduler.submit(EngineRequest("f", prompt, 40, GREEDY), free)
        wait_until(lambda: len(source) == 1)  # the constrained request is running
        first = source.pid
        os.kill(first, signal.SIGKILL)
        constrained.wait()
        free.wait()
        assert constrained.error is not None and "mask process exited" in str(constrained.error)
        assert free.error is None and free.outputs[-1].finish_reason == FinishReason.LENGTH
        assert free.outputs[-1].completion_tokens == 40
        # Another mask process starts; requests are served as before, with the grammar the engine
        # has compiled already and with a new one.
        wait_until(lambda: source.pid != first)
        cached = EngineRequest("cached", prompt, 8, GREEDY, grammar=long_text)
        new = EngineRequest("new", prompt, 12, GREEDY, grammar=grammar_for(GuideType.CHOICE, '["yes"]'))
        again, yes = generate(scheduler, cached, new)
        assert again.error is None and again.outputs[-1].completion_tokens == 8
        assert re.fullmatch("[a-z ]+", again.text)
        assert yes.error is None and yes.text == "yes"
    finally:
        scheduler.shutdown()
        source.close()


def test_with_two_mask_processes_a_killed_one_ends_only_the_requests_it_kept(loaded_model: Any) -> None:
    """Two requests of two new grammars go to the two children; one is killed: its request ends with
    an error, the other's constraint holds to its end, and another child takes the next requests."""
    vocab = loaded_model.model.config.vocab_size
    source = MaskProcess(loaded_model.tokenizer, vocab, tuple(loaded_model.eos_token_ids), ROWS, 2, processes=2)
    scheduler = scheduler_for(loaded_model, processor_for(loaded_model, source))
    try:
        prompt = chat(loaded_model, "Write a long story about a cat.")
        sinks = [RecordingSink(), RecordingSink()]
        for letters, sink in zip(("a-m", "n-z"), sinks, strict=True):
            grammar = grammar_for(GuideType.REGEX, f"[{letters} ]{{3000}}")
            scheduler.submit(EngineRequest(letters, prompt, 100, GREEDY, grammar=grammar), sink)
        wait_until(lambda: len(source) == 2)  # both are running
        killed = source.pids[0]
        os.kill(killed, signal.SIGKILL)
        for sink in sinks:
            sink.wait()
        ended = [sink for sink in sinks if sink.error is not None]
        assert len(ended) == 1 and "mask process exited" in str(ended[0].error)
        (kept,) = [sink for sink in sinks if sink.error is None]
        assert kept.outputs[-1].completion_tokens == 100
        assert re.fullmatch("[a-m ]+", kept.text) or re.fullmatch("[n-z ]+", kept.text)
        wait_until(lambda: killed not in source.pids)
        new = EngineRequest("new", prompt, 12, GREEDY, grammar=grammar_for(GuideType.CHOICE, '["yes"]'))
        (yes,) = generate(scheduler, new)
        assert yes.error is None and yes.text == "yes"
    finally:
        scheduler.shutdown()
        source.close()


def test_a_constraint_that_arrives_while_the_mask_process_is_down_is_refused_as_unavailable(
    loaded_model: Any, mask_process: MaskProcess
) -> None:
    """A retry is the answer (503), not a server error; another mask process then serves it."""
    scheduler = scheduler_for(loaded_model, processor_for(loaded_model, mask_process))
    try:
        prompt = chat(loaded_model, "Name a colour.")
        choice = grammar_for(GuideType.CHOICE, '["red", "blue"]')
        (compiled,) = generate(scheduler, EngineRequest("compiled", prompt, 4, GREEDY, grammar=choice))
        assert compiled.error is None
        dead = mask_process.pid
        os.kill(dead, signal.SIGKILL)
        wait_until(lambda: _exited(dead))
        (refused,) = generate(scheduler, EngineRequest("refused", prompt, 4, GREEDY, grammar=choice))
        assert isinstance(refused.error, Unavailable) and "mask process" in str(refused.error)
        assert refused.outputs == []  # refused before any output
        wait_until(lambda: mask_process.pid != dead)
        (served,) = generate(scheduler, EngineRequest("served", prompt, 4, GREEDY, grammar=choice))
        assert served.error is None and served.text in {"red", "blue"}
    finally:
        scheduler.shutdown()


def test_the_mask_process_exits_with_the_engine(loaded_model: Any, tmp_path: Any) -> None:
    """An engine killed outright leaves no mask process behind: the child reads the end of its pipe."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from backend.mask_process import MaskProcess
        from backend.model_loader import load_model
        from llgtriton.settings import EngineSettings
        loaded = load_model(EngineSettings())
        vocab = loaded.model.config.vocab_size
        process = MaskProcess(loaded.tokenizer, vocab, tuple(loaded.eos_token_ids), 2, 1)
        print(process.pid, flush=True)
        time.sleep(600)
        """
    )
    engine = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert engine.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(engine.stdout.readline() if engine.stdout else ""))
        reader.start()
        reader.join(180)
        child = int(line[0])
        os.kill(child, 0)  # it runs
        engine.kill()
        engine.wait(10)
        deadline = time.monotonic() + 20
        while _alive(child):
            assert time.monotonic() < deadline, "the mask process outlived its engine"
            time.sleep(0.1)
    finally:
        engine.kill()
        engine.wait()
        if engine.stdout is not None:
            engine.stdout.close()


def _exited(child: int) -> bool:
    """Whether this process's child has exited, every thread of it (until then, a killed process whose
    threads are still ending shows as a zombie and cannot be waited for); it is left to be reaped."""
    return os.waitid(os.P_PID, child, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent gone, not yet reaped by init) has exited too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
