"""bench.pyspy_summary reads py-spy's raw profiles: processes by role, callees by samples."""

from __future__ import annotations

from pathlib import Path

from bench.pyspy_summary import callees, samples

RAW = (
    'process 7:"python -m bench.layers";process 9:"python -c from multiprocessing.spawn import spawn_main";'
    "thread (11): loop;Scheduler._loop (scheduler.py:1);Scheduler._step (scheduler.py:2);"
    "Scheduler._advance (scheduler.py:3) 5\n"
    'process 7:"python -m bench.layers";process 9:"python -c from multiprocessing.spawn import spawn_main";'
    "thread (11): loop;Scheduler._loop (scheduler.py:1);Scheduler._step (scheduler.py:2) 2\n"
    'process 7:"python -m bench.layers";thread (7): MainThread;'
    "main (layers.py:9);Scheduler._step (x.py:1);run (x.py:2) 4\n"
)


def test_samples_are_named_by_the_innermost_process_and_counted_under_a_function(tmp_path: Path) -> None:
    path = tmp_path / "profile.txt"
    path.write_text(RAW)
    profile = list(samples(path))
    assert [sample.process for sample in profile] == ["spawn_main 9", "spawn_main 9", "bench.layers 7"]
    assert profile[0].thread == "thread (11): loop"
    assert profile[0].frames == ("Scheduler._loop", "Scheduler._step", "Scheduler._advance")
    assert callees(profile, "spawn_main 9", "Scheduler._step", 1) == {"Scheduler._advance": 5, "(itself)": 2}
    assert callees(profile, "bench.layers 7", "Scheduler._step", 1) == {"run": 4}
