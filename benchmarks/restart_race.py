"""Repeated trials of the restart race on the real node (tests/integration/test_restart_race.py): a rank
killed (137) while its peers wait in a collective must restart the gang every time, and a rank that
fails first with a bug (exit 1) must end the Job every time. Prints how many of how many, for the
Volcano release the local cluster runs (scripts/volcano-cluster up --volcano V picks one; the trials keep
it, and the versions printed are those they ran on).

    .venv/bin/python benchmarks/restart_race.py --trials 20 [--bug-trials N] [--workers 2]

--workers runs that many trials at once (pytest-xdist), each in its own namespace: more load on the
node, which makes the race no easier to win.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--bug-trials", type=int, help="trials of the bug case (default: --trials)")
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    state = Path("/tmp/airflow-volcano-cluster/versions.json")
    running = json.loads(state.read_text()) if state.exists() else {}
    # The tests' fixture brings the cluster up at the versions these name (default: the newest): keep the
    # running ones, so the trials run on the release the cluster was started with.
    pinned = {"VOLCANO_CLUSTER_VOLCANO": running.get("volcano"),
              "VOLCANO_CLUSTER_KUBERNETES": running.get("kubernetes")}
    report = REPO / ".artifacts" / "restart_race.xml"
    report.parent.mkdir(exist_ok=True)
    workers = ["-n", str(args.workers)] if args.workers > 1 else []
    bug_trials = args.trials if args.bug_trials is None else args.bug_trials
    subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                     *workers, "tests/integration/test_restart_race.py"], cwd=REPO,
                    env={**os.environ, **{key: value for key, value in pinned.items() if value},
                         "RACE_TRIALS": str(args.trials), "RACE_BUG_TRIALS": str(bug_trials)})
    versions = json.loads(state.read_text()) if state.exists() else {}  # what the trials ran on
    results: dict[str, list[bool]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name", "").split("[")[0]
        passed = case.find("failure") is None and case.find("error") is None
        results.setdefault(name, []).append(passed)
    print(f"Volcano {versions.get('volcano', '?')}, Kubernetes {versions.get('kubernetes', '?')}:")
    for name, outcomes in results.items():
        print(f"  {sum(outcomes)} of {len(outcomes)} as they should: {name}")


if __name__ == "__main__":
    main()
