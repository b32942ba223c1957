"""perf_analyzer (Triton's load generator) as a layer of :mod:`bench.layers`: its input-data file from
the layers' requests, its run against Triton's gRPC endpoint, and the figures read from its profile
export (each request's send and response times, and the server's own token counts).
"""

from __future__ import annotations

import json
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llgtriton import wire


def _json_value(value: object) -> object:
    if isinstance(value, bytes):
        return value.decode()
    return value.item() if hasattr(value, "item") else value


def perf_analyzer_data(requests: Sequence[wire.GenerationRequest]) -> dict[str, Any]:
    """perf_analyzer's ``--input-data`` for ``requests``: the tensors the proxy would send, one entry each.

    Inputs a request leaves out are left out of its entry too; they are optional in the model's
    config, and perf_analyzer sends only what an entry names.
    """
    return {
        "data": [
            {name: [_json_value(v) for v in array.reshape(-1)] for name, array in wire.encode_request(r).items()}
            for r in requests
        ]
    }


def _int_value(value: object) -> int | None:
    """An INT32 output as perf_analyzer's export writes it: a number, a list of one, or text."""
    if isinstance(value, list) and value:
        return _int_value(value[0])
    if not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None


def perf_analyzer_tokens(request: dict[str, Any]) -> int | None:
    """The completion tokens of one request, from its last response's ``num_output_tokens`` (a running
    count) where the export holds the response outputs."""
    for output in reversed(request.get("response_outputs") or []):
        if isinstance(output, dict) and (tokens := _int_value(output.get(wire.NUM_OUTPUT_TOKENS))) is not None:
            return tokens
    return None


def perf_analyzer_figures(export: dict[str, Any]) -> dict[str, float]:
    """The closed-loop figures from perf_analyzer's profile export (times in ns).

    Tokens are the server's own count (``num_output_tokens``) where the export holds the responses'
    outputs; otherwise every streamed response counts as one token, which holds only while responses
    are not coalesced. ``counted_tokens`` says which. A request's TBT is its mean gap between first
    and last response, per token after the first.
    """
    requests = [r for e in export["experiments"] for r in e["requests"] if r.get("response_timestamps")]
    if not requests:
        raise RuntimeError("perf_analyzer exported no request with responses")
    counted = [perf_analyzer_tokens(r) for r in requests]
    exact = all(tokens is not None for tokens in counted)
    tokens = [
        t if exact and t is not None else len(r["response_timestamps"]) for t, r in zip(counted, requests, strict=True)
    ]
    ttfts = [(r["response_timestamps"][0] - r["timestamp"]) / 1e9 for r in requests]
    tbts = [
        (r["response_timestamps"][-1] - r["response_timestamps"][0]) / (n - 1) / 1e9
        for r, n in zip(requests, tokens, strict=True)
        if n > 1 and len(r["response_timestamps"]) > 1
    ]
    first = min(r["timestamp"] for r in requests)
    last = max(r["response_timestamps"][-1] for r in requests)
    return {
        "ttft_ms_p50": statistics.median(ttfts) * 1e3,
        "tbt_ms_p50": statistics.median(tbts) * 1e3,
        "tokens_per_s": sum(tokens) / ((last - first) / 1e9),
        "mean_tokens": sum(tokens) / len(requests),
        "requests": len(requests),
        "counted_tokens": 1.0 if exact else 0.0,  # 1: the server's count; 0: one per response
        "window_start_s": first / 1e9,  # perf_analyzer's timestamps are the system clock's, in ns
        "window_end_s": last / 1e9,
    }


def run_perf_analyzer(
    binary: str, data: Path, *, grpc_port: int, concurrency: int, count: int, work: Path
) -> dict[str, float]:
    """perf_analyzer streaming over gRPC at ``concurrency``, windows of ``count`` requests."""
    export = work / f"perf_analyzer_{data.stem}_c{concurrency}.json"
    export.unlink(missing_ok=True)  # perf_analyzer refuses to overwrite one (a second run in one work folder)
    command = [
        binary,
        "-m",
        "llm",
        "-i",
        "grpc",
        "-u",
        f"127.0.0.1:{grpc_port}",
        "--streaming",
        "--input-data",
        str(data),
        "--concurrency-range",
        f"{concurrency}:{concurrency}",
        "--measurement-mode",
        "count_windows",
        "--measurement-request-count",
        str(count),
        "--stability-percentage",
        "100",  # the closed loop's figures come from the export; 3 windows are enough
        "--profile-export-file",
        str(export),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if result.returncode != 0 or not export.exists():
        raise RuntimeError(
            f"perf_analyzer failed ({result.returncode}): {result.stdout[-2000:]} {result.stderr[-2000:]}"
        )
    return perf_analyzer_figures(json.loads(export.read_text()))
