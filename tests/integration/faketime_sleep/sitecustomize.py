"""Loaded by the Python processes test_clock_skew.py runs under libfaketime (this folder on their PYTHONPATH).

libfaketime 0.9.10 (Debian bookworm's, and the one PyPI's libfaketime bundles) moves the absolute deadline
of clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) by the faked wall-clock offset even when monotonic
clocks are not faked (libfaketime issue #426, fixed in 0.9.11), and Python 3.11's time.sleep sleeps that
way: every time.sleep fails with EINVAL. Sleeping with select() instead leaves the skew itself (the wall
clock, which is what the tests move) untouched.
"""

import os
import select
import time

if os.environ.get("FAKETIME"):
    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            select.select([], [], [], left)

    time.sleep = _sleep
