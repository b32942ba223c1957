"""aiperf (NVIDIA's load generator, PyPI ``aiperf``) against the proxy's chat endpoint, as a layer of
:mod:`bench.layers`: the same prompts, ``max_tokens``, greedy, free or JSON-schema-constrained.

aiperf runs in a process of its own (its clients in its own worker processes), so the proxy's
figure is no longer the benchmark's Python client's. It needs a tokenizer to count tokens and
cannot load one from a plain folder offline (it asks the hub for a path), so
:func:`hub_cache_tokenizer` lays a model folder's tokenizer out as a hub cache entry, named by id.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")
TOKENIZER_ID = "llgtriton/tokenizer"


def hub_cache_tokenizer(model: Path, hf_home: Path, repo_id: str = TOKENIZER_ID) -> str:
    """Copies ``model``'s tokenizer files into ``hf_home``'s hub cache as ``repo_id``; returns the id."""
    entry = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = entry / "snapshots" / "local"
    snapshot.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (model / name).exists():
            shutil.copyfile(model / name, snapshot / name)
    (entry / "refs").mkdir(exist_ok=True)
    (entry / "refs" / "main").write_text("local")
    return repo_id


@dataclass(frozen=True)
class AiperfRun:
    """One aiperf closed loop: ``concurrency`` clients share ``count`` requests."""

    command: str  # how to start aiperf here, e.g. "aiperf" or "python3 -m aiperf"
    url: str  # the proxy's base URL, without /v1
    model: str
    tokenizer: str
    hf_home: Path
    max_tokens: int


def prompts_file(path: Path, prompts: Sequence[str]) -> Path:
    """aiperf's ``single_turn`` dataset: one JSON line per prompt."""
    path.write_text("".join(json.dumps({"text": prompt}) + "\n" for prompt in prompts))
    return path


def aiperf_argv(
    run: AiperfRun, dataset: Path, *, concurrency: int, count: int, schema: Mapping[str, Any] | None, out: Path
) -> list[str]:
    extra: dict[str, Any] = {"max_tokens": run.max_tokens, "temperature": 0.0}
    if schema is not None:
        extra["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema, "strict": True},
        }
    return [
        *shlex.split(run.command),
        "profile",
        "--model",
        run.model,
        "--url",
        run.url,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--input-file",
        str(dataset),
        "--custom-dataset-type",
        "single_turn",
        "--extra-inputs",
        json.dumps(extra),
        "--tokenizer",
        run.tokenizer,
        "--concurrency",
        str(concurrency),
        "--request-count",
        str(count),
        "--output-artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]


def _metric(export: Mapping[str, Any], name: str, stat: str) -> float:
    return float(export[name][stat])


def aiperf_figures(export: Mapping[str, Any]) -> dict[str, float]:
    """Our layers' figures from aiperf's ``profile_export_aiperf.json``.

    Tokens/s counts the completion tokens the server reported (``usage``), as our own clients do;
    aiperf's own count (re-tokenizing the text) is kept beside it.
    """
    duration = _metric(export, "benchmark_duration", "avg")
    completed = _metric(export, "completed_request_count", "avg") if "completed_request_count" in export else 0.0
    requests = _metric(export, "request_count", "avg")
    return {
        "failed": requests - completed if completed else 0.0,
        "ttft_ms_p50": _metric(export, "time_to_first_token", "p50"),
        "tbt_ms_p50": _metric(export, "inter_token_latency", "p50"),
        "tbt_ms_p99": _metric(export, "inter_token_latency", "p99"),
        "tokens_per_s": _metric(export, "total_usage_completion_tokens", "avg") / duration,
        "aiperf_tokens_per_s": _metric(export, "output_token_throughput", "avg"),
        "mean_tokens": _metric(export, "usage_completion_tokens", "avg"),
        "requests": requests,
        # aiperf's measurement window (its local times), so the server's CPU is read over it alone
        "window_start_s": datetime.fromisoformat(export["start_time"]).timestamp(),
        "window_end_s": datetime.fromisoformat(export["end_time"]).timestamp(),
    }


def run_aiperf(
    run: AiperfRun,
    dataset: Path,
    *,
    concurrency: int,
    count: int,
    schema: Mapping[str, Any] | None,
    work: Path,
) -> dict[str, float]:
    """aiperf at ``concurrency`` over the first ``count`` prompts of ``dataset``; its figures."""
    out = work / f"aiperf_{'constrained' if schema is not None else 'free'}_c{concurrency}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "HF_HOME": str(run.hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = aiperf_argv(run, dataset, concurrency=concurrency, count=count, schema=schema, out=out)
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1800, env=env)
    export = out / "profile_export_aiperf.json"
    if result.returncode != 0 or not export.exists():
        raise RuntimeError(f"aiperf failed ({result.returncode}): {result.stdout[-2000:]} {result.stderr[-2000:]}")
    return aiperf_figures(json.loads(export.read_text()))
