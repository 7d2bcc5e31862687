"""The chaos soak's training script on the real node: every rank works SOAK_SECONDS, printing a line a
second, and the master then exits SOAK_EXIT (kwok's simulated pods never run it)."""

import os
import sys
import time

seconds = float(os.environ.get("SOAK_SECONDS", "5"))
rank = os.environ.get("RANK", "?")
started = time.monotonic()
step = 0
while time.monotonic() - started < seconds:
    step += 1
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(1)
code = int(os.environ.get("SOAK_EXIT", "0")) if rank == "0" else 0
if code:
    print(f"rank {rank} fails on purpose with exit code {code}", file=sys.stderr, flush=True)
sys.exit(code)
