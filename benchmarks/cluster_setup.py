"""How long the local cluster takes to come up: warm (everything cached) and cold (nothing cached).

Warm: `scripts/volcano-cluster down` then `up`, several times; the median is the figure (budget:
under 30 s, real node included). Cold: the same `up` with empty caches of its own (Go build and
module caches, binaries, images, containerd's root), as on a fresh machine (budget: under 25 min);
it prints the time of each build step from the script's log. Both stop any running cluster first,
and the cold run leaves the cluster of its empty caches running (`down` stops it). Run it alone:
the machine has 2 cores.

    .venv/bin/python benchmarks/cluster_setup.py [--warm-runs 3] [--cold]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLUSTER = Path(__file__).resolve().parent.parent / "scripts" / "volcano-cluster"
STEP = re.compile(r"\] +(?:(\S+) built in (\d+)s|image (\S+) built in (\d+)s|imported (\S+) in (\d+)s|"
                  r"cluster up in ([\d.]+)s)")


def cluster(command: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    started = time.monotonic()
    result = subprocess.run([str(CLUSTER), command], capture_output=True, text=True, env=env)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"`volcano-cluster {command}` failed:\n{result.stdout}\n{result.stderr}")
    return elapsed, result.stdout + result.stderr


def warm(runs: int) -> None:
    cluster("up")  # builds whatever is missing, so the runs below are warm
    samples = []
    for _ in range(runs):
        cluster("down")
        elapsed, _ = cluster("up")
        samples.append(elapsed)
    print(f"warm `up` (real node included), {runs} runs: median {statistics.median(samples):.1f}s, "
          f"max {max(samples):.1f}s (budget 30s)")


def cold() -> None:
    cluster("down")
    with tempfile.TemporaryDirectory(prefix="cold-cluster-", dir=os.environ.get("TMPDIR", "/var/tmp")) as scratch:
        env = dict(os.environ, VOLCANO_CLUSTER_CACHE=f"{scratch}/cache", GOCACHE=f"{scratch}/go-build",
                   GOMODCACHE=f"{scratch}/go-mod")
        elapsed, output = cluster("up", env)
        print(f"cold `up` from empty caches: {elapsed / 60:.1f} min (budget 25 min)")
        for line in output.splitlines():
            match = STEP.search(line)
            if match:
                print("   ", line.split("] ", 1)[1])
        cluster("down", env)
        # The Go module cache is read-only by design; make it removable.
        subprocess.run(["chmod", "-R", "u+w", scratch], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--cold", action="store_true", help="also measure a cold start (about 20 minutes)")
    options = parser.parse_args()
    warm(options.warm_runs)
    if options.cold:
        cold()


if __name__ == "__main__":
    main()
