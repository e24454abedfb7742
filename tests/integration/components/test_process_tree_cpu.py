"""benchmarks.common.ProcessTreeCpu samples the CPU time of this process and its children:
a real child process's time is counted."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.common import ProcessTreeCpu, interpolate


def test_process_tree_cpu_counts_a_child_process():
    """A child that burns 0.4 s of its own CPU time is counted (it is not this process)."""
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    with ProcessTreeCpu(interval=0.05) as cpu:
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", burn])
        child.wait(timeout=60)
        t1 = time.perf_counter()
    spent = interpolate(cpu.samples, t1) - interpolate(cpu.samples, t0)
    # At least the burn minus the last sampling interval it may have run after the last
    # reading (<= 0.05 s of CPU); at most the burn plus interpreter start-up and sampling.
    assert 0.33 <= spent <= 0.4 + 1.0, spent
    assert [v for _, v in cpu.samples] == sorted(v for _, v in cpu.samples)
