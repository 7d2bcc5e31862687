"""DAG-parse cost: importing our operator module vs cncf's KubernetesPodOperator.

Each import runs in a fresh interpreter (as a DAG processor parsing a file would pay it), after
`airflow.sdk` is already imported (every DAG file pays that anyway). Prints median wall time,
peak RSS, and whether the kubernetes client got imported.

    .venv/bin/python benchmarks/dag_parse.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROBE = """
import json, resource, sys, time
import airflow.sdk  # paid by every DAG file
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
import {module}
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed,
                   "rss_kib_added": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before,
                   "kubernetes_imported": "kubernetes" in sys.modules}}))
"""
SUBJECTS = {
    "airflow-volcano VolcanoPyTorchJobOperator": "airflow_volcano.operators.pytorch",
    "cncf KubernetesPodOperator": "airflow.providers.cncf.kubernetes.operators.pod",
}


def measure(module: str, runs: int) -> dict:
    samples = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], capture_output=True, text=True,
                             check=True).stdout
        samples.append(json.loads(out.strip().splitlines()[-1]))
    return {
        "median_ms": statistics.median(s["seconds"] for s in samples) * 1000,
        "rss_mib": statistics.median(s["rss_kib_added"] for s in samples) / 1024,
        "kubernetes_imported": samples[0]["kubernetes_imported"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    results = {name: measure(module, args.runs) for name, module in SUBJECTS.items()}
    print(f"{'import':45} {'median ms':>10} {'RSS +MiB':>9}  kubernetes client imported")
    for name, r in results.items():
        print(f"{name:45} {r['median_ms']:10.1f} {r['rss_mib']:9.1f}  {r['kubernetes_imported']}")
    ours, theirs = results.values()
    print(f"cncf/ours: {theirs['median_ms'] / ours['median_ms']:.0f}x the import time, "
          f"{theirs['rss_mib'] - ours['rss_mib']:.0f} MiB more memory per parsing process")


if __name__ == "__main__":
    main()
