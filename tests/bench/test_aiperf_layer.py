"""aiperf's layer of the serving benchmark: the command it runs, the tokenizer it finds, the figures it reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.aiperf_layer import AiperfRun, aiperf_argv, aiperf_figures, hub_cache_tokenizer, prompts_file

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def run(tmp_path: Path) -> AiperfRun:
    return AiperfRun("python3 -m aiperf", "http://127.0.0.1:9000", "m", "org/tok", tmp_path, max_tokens=64)


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_every_request_carries_the_layers_body_and_the_constraint(tmp_path: Path) -> None:
    argv = aiperf_argv(run(tmp_path), tmp_path / "p.jsonl", concurrency=8, count=16, schema=SCHEMA, out=tmp_path)
    assert argv[:4] == ["python3", "-m", "aiperf", "profile"]
    assert option(argv, "--endpoint-type") == "chat" and "--streaming" in argv
    assert (option(argv, "--concurrency"), option(argv, "--request-count")) == ("8", "16")
    extra = json.loads(option(argv, "--extra-inputs"))
    assert extra["max_tokens"] == 64 and extra["temperature"] == 0.0
    assert extra["response_format"]["json_schema"]["schema"] == SCHEMA


def test_free_requests_carry_no_response_format(tmp_path: Path) -> None:
    argv = aiperf_argv(run(tmp_path), tmp_path / "p.jsonl", concurrency=1, count=2, schema=None, out=tmp_path)
    assert "response_format" not in json.loads(option(argv, "--extra-inputs"))


def test_the_tokenizer_is_laid_out_as_a_hub_cache_entry(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "config.json").write_text("{}")
    name = hub_cache_tokenizer(model, tmp_path / "hf", "org/tok")
    entry = tmp_path / "hf" / "hub" / "models--org--tok"
    assert name == "org/tok"
    assert (entry / "refs" / "main").read_text() == "local"
    assert sorted(p.name for p in (entry / "snapshots" / "local").iterdir()) == ["config.json", "tokenizer.json"]


def test_the_prompts_file_is_one_json_line_per_prompt(tmp_path: Path) -> None:
    path = prompts_file(tmp_path / "p.jsonl", ["a", 'say "b"'])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"text": "a"}, {"text": 'say "b"'}]


def test_figures_count_the_servers_tokens_over_the_benchmarks_duration() -> None:
    export = {
        "benchmark_duration": {"avg": 2.0},
        "request_count": {"avg": 10.0},
        "completed_request_count": {"avg": 9.0},
        "time_to_first_token": {"p50": 12.5},
        "inter_token_latency": {"p50": 3.0, "p99": 9.0},
        "total_usage_completion_tokens": {"avg": 640.0},
        "output_token_throughput": {"avg": 300.0},
        "usage_completion_tokens": {"avg": 64.0},
        "start_time": "2026-11-27T14:00:00.000000",
        "end_time": "2026-11-27T14:00:02.000000",
    }
    figures = aiperf_figures(export)
    assert figures["tokens_per_s"] == 320.0 and figures["aiperf_tokens_per_s"] == 300.0
    assert figures["failed"] == 1.0 and figures["ttft_ms_p50"] == 12.5 and figures["tbt_ms_p99"] == 9.0
    assert figures["window_end_s"] - figures["window_start_s"] == pytest.approx(2.0)
