"""``pid_alive(pid, start)``: a process number reused by a later process or thread is not the
process whose start time was recorded (``forge top`` on a busy host, where 32768 numbers wrap)."""

from __future__ import annotations

import os
import threading

from controller import pid_alive
from controller._reaper import start_time


def test_a_recorded_start_time_tells_the_process_from_a_reused_number():
    me = os.getpid()
    start = start_time(me)
    assert start is not None and pid_alive(me) and pid_alive(me, start)
    assert not pid_alive(me, str(int(start) - 1))  # the number's earlier owner is gone
    ready, done, tid = threading.Event(), threading.Event(), []

    def park():
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    t = threading.Thread(target=park)
    t.start()
    try:
        ready.wait(10)
        assert tid[0] != me and pid_alive(tid[0])  # kill(tid, 0) answers for a thread too
        assert not pid_alive(tid[0], start) or start_time(tid[0]) == start
    finally:
        done.set()
        t.join(10)
