"""CPU per server process: the busy process is named by its role and counted in cores."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.process_cpu import CpuRecorder

BUSY = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"


def test_a_busy_child_shows_about_one_core() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}])"]
    )
    try:
        recorder = CpuRecorder(parent.pid, period_s=0.05)
        recorder.start()
        started = time.time()
        time.sleep(1.0)
        cores = recorder.cores_between(started + 0.1, time.time())
        recorder.stop()
    finally:
        parent.wait(timeout=30)
    assert 0.5 < cores["other"] <= 1.1  # a plain python child of the launcher: neither Triton nor a proxy worker
    assert cores["launcher"] < 0.3
