"""The trtllm engine adapter, against the fake TensorRT-LLM 1.2 in tests/fakes (see its README).

Both routes run: a prepared checkpoint through the LLM API (PyTorch backend), and a prepared
engine through the executor with our batched post-processor. The tokenizer, the chat template,
llguidance and our service are real; the model is the fake's toy, which answers garbage unless
the constraint steers it, so a valid JSON output shows the mask was applied.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import torch

from backend.constraints import GuidanceLogitsProcessor
from backend.entry import start_service
from backend.errors import BackendError, Unsupported
from backend.model_loader import checkpoint_path
from backend.service import GenerationService
from backend.trtllm import hooks
from backend.trtllm.model_files import ModelFilesError
from launcher.cli import main as cli_main
from llgtriton.messages import ChatMessage
from llgtriton.settings import EngineSettings
from llgtriton.wire import FinishReason, GenerationRequest, GuideType
from tests.support.harness import ROOT, RecordingSink

FAKES = ROOT / "tests" / "fakes"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def fake_tensorrt_llm() -> Iterator[None]:
    sys.path.insert(0, str(FAKES))
    yield
    sys.path.remove(str(FAKES))
    for name in [name for name in sys.modules if name == "tensorrt_llm" or name.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def checkpoint_folder(tmp_path_factory: pytest.TempPathFactory, loaded_model: Any) -> Path:
    """The embedded model's checkpoint, prepared for TensorRT-LLM by the real 'llgtriton prepare'."""
    folder = tmp_path_factory.mktemp("prepared") / "smollm2"
    assert cli_main(["prepare", str(checkpoint_path(EngineSettings())), str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def engine_folder(checkpoint_folder: Path) -> Path:
    """A prepared folder holding an engine (its config.json as trtllm-build writes it; the fake needs no weights)."""
    folder = checkpoint_folder.parent / "smollm2-engine"
    (folder / "engine").mkdir(parents=True)
    (folder / "tokenizer").symlink_to(checkpoint_folder / "tokenizer")
    vocab = json.loads((checkpoint_folder / "checkpoint" / "config.json").read_text())["vocab_size"]
    config = {"pretrained_config": {"vocab_size": vocab}, "build_config": {"max_seq_len": 2048}}
    (folder / "engine" / "config.json").write_text(json.dumps(config))
    (folder / "engine" / "rank0.engine").write_bytes(b"")
    manifest = json.loads((checkpoint_folder / "llgtriton-model.json").read_text())
    (folder / "llgtriton-model.json").write_text(json.dumps({**manifest, "serve": "engine"}))
    return folder


@pytest.fixture(scope="module", params=["checkpoint", "engine"])
def service(
    request: pytest.FixtureRequest, fake_tensorrt_llm: None, checkpoint_folder: Path, engine_folder: Path
) -> Iterator[GenerationService]:
    folder = checkpoint_folder if request.param == "checkpoint" else engine_folder
    running = start_service(EngineSettings(engine="trtllm", model=str(folder), max_batch_size=4))
    assert isinstance(running, GenerationService)
    yield running
    running.shutdown()


def run(service: GenerationService, sink: RecordingSink | None = None, **fields: Any) -> RecordingSink:
    sink = sink or RecordingSink()
    fields.setdefault("temperature", 0.0)
    service.submit(GenerationRequest(**fields), f"req-{id(sink)}", sink)
    sink.wait()
    return sink


def json_request(**fields: Any) -> dict[str, Any]:
    return {
        "messages": (ChatMessage("user", "Give me a JSON object."),),
        "guide_type": GuideType.JSON_SCHEMA,
        "guide": json.dumps(SCHEMA),
        "max_tokens": 64,
        **fields,
    }


def test_the_constraint_steers_the_engine_to_valid_json(service: GenerationService) -> None:
    sink = run(service, **json_request())
    assert sink.error is None
    assert sink.outputs[-1].finish_reason == FinishReason.STOP
    jsonschema.validate(json.loads(sink.text), SCHEMA)


def test_sampled_constrained_outputs_are_valid_for_every_seed(service: GenerationService) -> None:
    for seed in range(4):
        sink = run(service, **json_request(temperature=1.0, seed=seed))
        assert sink.error is None, sink.error
        jsonschema.validate(json.loads(sink.text), SCHEMA)


def test_without_a_constraint_the_toy_model_rambles_to_the_length_limit(service: GenerationService) -> None:
    sink = run(service, prompt="Hello", max_tokens=5)
    assert sink.outputs[-1].finish_reason == FinishReason.LENGTH
    assert sink.outputs[-1].completion_tokens == 5


def test_streaming_sends_pieces_that_add_up_to_the_text(service: GenerationService) -> None:
    whole = run(service, **json_request())
    streamed = run(service, **json_request(stream=True))
    assert len(streamed.outputs) > 3
    assert streamed.text == whole.text


def test_a_stop_string_ends_free_text_before_it(service: GenerationService) -> None:
    whole = run(service, prompt="Hello", max_tokens=12).text
    stop = whole[4:7]
    sink = run(service, prompt="Hello", max_tokens=12, stop=(stop,))
    assert sink.outputs[-1].finish_reason == FinishReason.STOP
    assert sink.text == whole[: whole.index(stop)]


def test_a_stop_string_inside_a_constrained_output_is_text(service: GenerationService) -> None:
    """The JSON is complete only at its end: a stop string before that cannot end it (never ``stop``
    with broken JSON)."""
    whole = run(service, **json_request()).text
    stop = whole[whole.index(":") :][:3]
    sink = run(service, **json_request(stop=(stop,)))
    assert sink.outputs[-1].finish_reason == FinishReason.STOP
    assert sink.text == whole
    jsonschema.validate(json.loads(sink.text), SCHEMA)


def test_the_same_seed_gives_the_same_output_and_another_seed_another(service: GenerationService) -> None:
    texts = [run(service, prompt="Hello", max_tokens=12, temperature=1.0, seed=seed).text for seed in (1, 1, 2)]
    assert texts[0] == texts[1]
    assert texts[0] != texts[2]


def test_a_logit_bias_reaches_the_engine(service: GenerationService) -> None:
    token = service.prompt_ids(GenerationRequest(prompt=" banana"))[0]
    sink = run(service, prompt="Hello", max_tokens=3, logit_bias=((token, 100.0),))
    assert sink.text == " banana" * 3


def test_ignore_eos_reaches_tensorrt_llm(service: GenerationService, tokenizer: Any) -> None:
    forced_end = ((tokenizer.eos_token_id, 100.0),)  # the toy model then always picks the end token
    ended = run(service, prompt="Hello", max_tokens=4, logit_bias=forced_end)
    assert (ended.outputs[-1].finish_reason, ended.outputs[-1].completion_tokens) == (FinishReason.STOP, 0)
    ignored = run(service, prompt="Hello", max_tokens=4, logit_bias=forced_end, ignore_eos=True)
    assert (ignored.outputs[-1].finish_reason, ignored.outputs[-1].completion_tokens) == (FinishReason.LENGTH, 4)


def test_a_cancelled_request_stops_and_ends_with_a_final_response_without_a_reason(service: GenerationService) -> None:
    sink = run(service, RecordingSink(cancel_after=2), prompt="Hello", max_tokens=500, stream=True)
    assert sink.error is None
    # (The final response may carry the last tokens' text: the service's response thread joins what
    # is still queued when the request ends.)
    assert sink.outputs[-1].finish_reason is None
    assert sink.outputs[-1].completion_tokens < 100
    assert service.load() == (0, 0)


@pytest.mark.parametrize(
    ("request_", "asked"),
    [
        (GenerationRequest(prompt="Hi", logprobs=True), "logprobs"),
        (GenerationRequest(prompt="Hi", grammar_pressure=True), "grammar_pressure"),
    ],
)
def test_what_tensorrt_llm_cannot_report_is_refused_not_dropped(
    service: GenerationService, request_: GenerationRequest, asked: str
) -> None:
    sink = RecordingSink()
    service.submit(request_, "r", sink)
    sink.wait()
    assert isinstance(sink.error, Unsupported) and asked in str(sink.error)


def test_a_failing_post_processor_ends_only_its_own_request(
    service: GenerationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("injected failure")

    # The LLM API route masks in RequestLogitsProcessor, the executor route in GuidanceLogitsProcessor.
    monkeypatch.setattr(hooks.RequestLogitsProcessor, "_mask_logits", broken)
    monkeypatch.setattr(GuidanceLogitsProcessor, "mask", broken)
    constrained, plain = RecordingSink(), RecordingSink()
    service.submit(GenerationRequest(**json_request(temperature=0.0)), "constrained", constrained)
    service.submit(GenerationRequest(prompt="Hello", max_tokens=20, temperature=0.0), "plain", plain)
    constrained.wait()
    plain.wait()
    assert isinstance(constrained.error, BackendError)
    assert "constraint" in str(constrained.error)
    assert plain.error is None
    assert plain.outputs[-1].completion_tokens == 20


def test_tensor_and_pipeline_parallel_sizes_reach_tensorrt_llm(
    fake_tensorrt_llm: None, checkpoint_folder: Path
) -> None:
    settings = EngineSettings(engine="trtllm", model=str(checkpoint_folder), tensor_parallel_size=2)
    running = start_service(settings.model_copy(update={"pipeline_parallel_size": 2}))
    try:
        from tensorrt_llm.llmapi.llm import LLM  # the fake's, which records its instances

        llm = LLM.created[-1]
        assert llm.args["tensor_parallel_size"] == 2
        assert llm.args["pipeline_parallel_size"] == 2
        assert llm.args["kv_cache_config"].free_gpu_memory_fraction == 0.9
    finally:
        running.shutdown()


def test_an_engine_built_for_two_gpus_with_a_padded_vocabulary_is_constrained_too(
    fake_tensorrt_llm: None, engine_folder: Path, tmp_path: Path
) -> None:
    """An odd vocabulary on TP 2: the engine's logits are one column wider than the vocabulary."""
    folder = tmp_path / "padded"
    shutil.copytree(engine_folder, folder, symlinks=True)
    config_file = folder / "engine" / "config.json"
    config = json.loads(config_file.read_text())
    vocab = config["pretrained_config"]["vocab_size"] + 1
    assert vocab % 2 == 1
    config["pretrained_config"] |= {"vocab_size": vocab, "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}}
    config_file.write_text(json.dumps(config))
    running = start_service(EngineSettings(engine="trtllm", model=str(folder), max_batch_size=4))
    assert isinstance(running, GenerationService)
    try:
        for seed in range(3):
            sink = run(running, **json_request(temperature=1.0, seed=seed))
            assert sink.error is None, sink.error
            jsonschema.validate(json.loads(sink.text), SCHEMA)
    finally:
        running.shutdown()


def test_a_padding_column_never_survives_the_batched_hook(fake_tensorrt_llm: None) -> None:
    """Unconstrained rows too: the padding columns past the vocabulary are no tokens."""

    class NoConstraints:
        vocab_size = 5

        def consume(self, *args: Any) -> None:
            pass

        def mask(self, *args: Any) -> None:
            pass

    hook = hooks.BatchedHook(cast(GuidanceLogitsProcessor, NoConstraints()), eos_token_ids=[0])
    logits = [torch.zeros(1, 1, 6), torch.zeros(1, 1, 6)]
    hook([1, 2], logits, [[[3]], [[4]]], 0, [7, None])
    for row in logits:
        assert row[0, 0, 5] == float("-inf")
        assert torch.all(row[0, 0, :5] == 0)


def test_an_engine_folder_without_a_tokenizer_is_refused_clearly(fake_tensorrt_llm: None, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"build_config": {}, "pretrained_config": {}}))
    with pytest.raises(ModelFilesError, match="llgtriton prepare"):
        start_service(EngineSettings(engine="trtllm", model=str(tmp_path)))


def test_output_the_constraint_does_not_allow_is_an_error_never_a_response(
    service: GenerationService, monkeypatch: pytest.MonkeyPatch
) -> None:
    def silently_skipped(*args: Any) -> None:  # a post-processor that did nothing, without failing
        return None

    monkeypatch.setattr(hooks.RequestLogitsProcessor, "__call__", silently_skipped)
    monkeypatch.setattr(hooks.BatchedHook, "__call__", silently_skipped)
    sink = run(service, **json_request(stream=True))
    assert isinstance(sink.error, BackendError)
    assert "does not allow" in str(sink.error)
    assert all(output.finish_reason is None for output in sink.outputs)
