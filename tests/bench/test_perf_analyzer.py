"""perf_analyzer's layer of the three-layer benchmark: its shipped input files and its figures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.layers import SHIPPED_DATA, layer_requests
from bench.perf_analyzer_layer import perf_analyzer_data, perf_analyzer_figures
from llgtriton import wire
from tests.support.harness import ROOT

SHIPPED = ROOT / "bench" / "perf_analyzer"


@pytest.mark.parametrize("constrained", [False, True])
def test_the_shipped_input_files_hold_the_requests_the_other_layers_send(constrained: bool) -> None:
    shipped = json.loads((SHIPPED / ("constrained.json" if constrained else "free.json")).read_text())
    requests = layer_requests(SHIPPED_DATA["requests"], SHIPPED_DATA["max_tokens"], constrained)
    assert shipped == perf_analyzer_data(requests)  # regenerate: python -m bench.layers --write-perf-analyzer-data


@pytest.mark.parametrize("constrained", [False, True])
def test_an_entry_reaches_the_model_as_the_same_request(constrained: bool) -> None:
    """Triton hands the model each entry's values as [1, 1] tensors; the model decodes those."""
    request = layer_requests(1, 64, constrained)[0]
    (entry,) = perf_analyzer_data([request])["data"]

    def tensor(name: str) -> wire.Array | None:
        if name not in entry:
            return None
        values = entry[name]
        if isinstance(values[0], str):
            return np.array([[v.encode() for v in values]], dtype=np.object_)
        return np.array([values])

    decoded = wire.decode_request(tensor)
    assert decoded == request
    assert (decoded.guide_type is not None) == constrained


def test_figures_come_from_each_requests_send_and_response_times() -> None:
    ms = 1_000_000  # the export is in ns
    export = {
        "experiments": [
            {
                "experiment": {"mode": "concurrency", "value": 2},
                "requests": [
                    {"timestamp": 0, "response_timestamps": [10 * ms, 12 * ms, 14 * ms, 16 * ms]},
                    {"timestamp": 5 * ms, "response_timestamps": [25 * ms, 29 * ms, 33 * ms, 45 * ms]},
                    {"timestamp": 6 * ms, "response_timestamps": []},  # not answered in the window
                ],
            }
        ]
    }
    figures = perf_analyzer_figures(export)
    assert figures["ttft_ms_p50"] == pytest.approx(15.0)  # median of 10 and 20
    assert figures["tbt_ms_p50"] == pytest.approx((2.0 + 20 / 3) / 2)
    assert figures["tokens_per_s"] == pytest.approx(8 / 0.045)
    assert figures["requests"] == 2


def test_an_export_without_responses_is_an_error_not_a_zero() -> None:
    with pytest.raises(RuntimeError, match="no request"):
        perf_analyzer_figures({"experiments": [{"requests": [{"timestamp": 1, "response_timestamps": []}]}]})


def test_coalesced_responses_count_the_tokens_the_server_reports() -> None:
    """Under load a response carries several tokens: the running ``num_output_tokens`` counts them."""
    ms = 1_000_000
    request = {
        "timestamp": 0,
        "response_timestamps": [10 * ms, 20 * ms],
        "response_outputs": [{"text_output": "ab", "num_output_tokens": [3]}, {"num_output_tokens": "9"}],
    }
    figures = perf_analyzer_figures({"experiments": [{"requests": [request]}]})
    assert figures["mean_tokens"] == 9 and figures["counted_tokens"] == 1.0
    assert figures["tbt_ms_p50"] == pytest.approx(10 / 8)
    assert figures["tokens_per_s"] == pytest.approx(9 / 0.020)


def test_without_outputs_each_response_counts_as_one_token_and_says_so() -> None:
    request = {"timestamp": 0, "response_timestamps": [1, 2, 3]}
    figures = perf_analyzer_figures({"experiments": [{"requests": [request]}]})
    assert figures["mean_tokens"] == 3 and figures["counted_tokens"] == 0.0
