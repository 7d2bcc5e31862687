"""Triggerer capacity: one asyncio event loop (as in Airflow's triggerer) running VolcanoJobTrigger
for N Running Volcano Jobs at once. Prints the loop's memory and CPU while they all wait.

Uses the local cluster (scripts/volcano-cluster up); adds kwok nodes so N pods fit.

    .venv/bin/python benchmarks/triggerer_capacity.py [--jobs 1000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import time
from pathlib import Path

from common import master_only_job

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench-triggerer"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def watch_all(refs: list[dict], connection: dict, seconds: float) -> dict:
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    baseline = rss_mib()
    tasks = [asyncio.create_task(anext(VolcanoJobTrigger(ref, connection, get_logs=False).run())) for ref in refs]
    await asyncio.sleep(15)  # every trigger has read its Job and opened its watch
    cpu0, t0, rss_after_start = cpu_seconds(), time.monotonic(), rss_mib()
    await asyncio.sleep(seconds)
    cpu = (cpu_seconds() - cpu0) / (time.monotonic() - t0)
    finished = [task.result().payload for task in tasks if task.done() and not task.cancelled()]
    reasons = sorted({f"{p['status']}: {p.get('message', p.get('phase'))}"[:200] for p in finished})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"baseline_mib": baseline, "rss_mib": rss_after_start, "peak_mib": rss_mib(), "cpu": cpu,
            "finished_early": len(finished), "reasons": reasons}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one connection per watch
    kubeconfig = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "up"], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait"], capture_output=True)
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
    nodes = [{"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": f"bench-node-{i}", "annotations": {"kwok.x-k8s.io/node": "fake"}},
              "status": {"allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "250"},
                         "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "250"}}}
             for i in range(args.jobs // 250 + 1)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": nodes}), text=True, check=True,
                   capture_output=True)

    from kubernetes import client, config

    from airflow_volcano.job_runner import JobRef

    api = client.CustomObjectsApi(config.new_client_from_config(kubeconfig))
    started = time.monotonic()
    for i in range(args.jobs):
        body = master_only_job(f"cap-{i}", {"outcome": "run-forever"})
        api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", body)
    while True:
        jobs = api.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs")["items"]
        running = [j for j in jobs if (j.get("status") or {}).get("state", {}).get("phase") == "Running"]
        if len(running) == args.jobs or time.monotonic() - started > 900:
            break
        time.sleep(5)
    print(f"{len(running)}/{args.jobs} Jobs Running after {time.monotonic() - started:.0f}s")
    refs = [JobRef.from_job(job, "master").to_dict() for job in running]
    connection = {"config_dict": __import__("yaml").safe_load(Path(kubeconfig).read_text()), "in_cluster": False,
                  "cluster_context": None}
    result = asyncio.run(watch_all(refs, connection, args.seconds))
    print(f"one event loop, {len(refs)} deferred VolcanoJobTriggers watching Running Jobs for {args.seconds:.0f}s:")
    print(f"  RSS: {result['baseline_mib']:.0f} MiB before, {result['rss_mib']:.0f} MiB with all watching "
          f"({(result['rss_mib'] - result['baseline_mib']) * 1024 / max(1, len(refs)):.0f} KiB per trigger), "
          f"peak {result['peak_mib']:.0f} MiB")
    print(f"  CPU: {result['cpu'] * 100:.1f}% of one core while waiting; {result['finished_early']} fired early")
    for reason in result["reasons"]:
        print(f"    fired: {reason}")
    # The namespace first: kwok must still manage the nodes to finish deleting their pods.
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait", "--timeout=600s"], capture_output=True)
    subprocess.run([*kubectl, "delete", "node", *[n["metadata"]["name"] for n in nodes], "--wait=false"],
                   capture_output=True)


if __name__ == "__main__":
    main()
