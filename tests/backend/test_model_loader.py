"""How many threads torch's operators get: a CPU engine leaves a core to the rest of the server."""

from __future__ import annotations

import pytest

from backend import model_loader
from backend.model_loader import torch_threads
from llgtriton.settings import EngineSettings


@pytest.mark.parametrize(("cores", "threads"), [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_a_cpu_engine_leaves_one_core_to_triton_and_the_proxy(
    monkeypatch: pytest.MonkeyPatch, cores: int, threads: int
) -> None:
    monkeypatch.setattr(model_loader, "usable_cores", lambda: cores)
    assert torch_threads(EngineSettings(device="cpu"), environ={}) == threads


def test_num_threads_is_taken_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_loader, "usable_cores", lambda: 16)
    assert torch_threads(EngineSettings(device="cpu", num_threads=16), environ={}) == 16
    assert torch_threads(EngineSettings(device="cuda", num_threads=2), environ={}) == 2


def test_omp_num_threads_and_gpu_engines_keep_torchs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_loader, "usable_cores", lambda: 16)
    assert torch_threads(EngineSettings(device="cpu"), environ={"OMP_NUM_THREADS": "8"}) is None
    assert torch_threads(EngineSettings(device="cuda"), environ={}) is None
