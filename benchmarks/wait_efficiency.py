"""Waiting on a Volcano Job: our watch-based wait vs a 10 s polling loop, side by side.

The peer is the loop cncf's SparkKubernetesOperator launcher uses: GET the custom object, sleep
10 s, repeat. Both wait on the same real Jobs on the local cluster (scripts/volcano-cluster up),
at the same time. Figures:
  - completion latency: from the moment the Job turns Completed (seen by an independent watch)
    to the moment each waiter returns;
  - API requests per waiting job-minute, counted at each waiter's ApiClient.

    .venv/bin/python benchmarks/wait_efficiency.py [--jobs 5] [--run-for 120s]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

from common import master_only_job

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench-wait"


def counting_hook():
    from airflow_volcano.hooks.volcano import VolcanoHook

    hook = VolcanoHook()
    api = hook.api_client
    original = api.call_api
    hook.requests = 0

    def call_api(*args, **kwargs):
        hook.requests += 1
        return original(*args, **kwargs)

    api.call_api = call_api
    return hook


def ours(name: str, out: dict) -> None:
    from airflow_volcano.job_runner import JobRef, WaitLimits, wait_for_job

    hook = counting_hook()
    ref = JobRef.from_job(hook.get_job(name, NAMESPACE), "master")
    hook.requests = 0
    start = time.time()
    wait_for_job(hook, ref, WaitLimits(startup_timeout=600))
    out.update(returned=time.time(), requests=hook.requests, waited=time.time() - start)


def polling_loop(name: str, out: dict, interval: float = 10.0) -> None:
    hook = counting_hook()
    hook.requests = 0
    start = time.time()
    while True:
        job = hook.get_job(name, NAMESPACE)
        if ((job or {}).get("status") or {}).get("state", {}).get("phase") in ("Completed", "Failed", "Terminated"):
            break
        time.sleep(interval)
    out.update(returned=time.time(), requests=hook.requests, waited=time.time() - start)


def observer(names: set[str], completed_at: dict) -> None:
    from kubernetes import client, config, watch

    api = client.CustomObjectsApi(config.new_client_from_config(os.environ["BENCH_KUBECONFIG"]))
    for event in watch.Watch().stream(api.list_namespaced_custom_object, "batch.volcano.sh", "v1alpha1",
                                      NAMESPACE, "jobs", timeout_seconds=1800):
        job = event["object"]
        name = job["metadata"]["name"]
        if name in names and name not in completed_at and (job.get("status") or {}).get("state", {}).get(
                "phase") == "Completed":
            completed_at[name] = time.time()
        if len(completed_at) == len(names):
            return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=5)
    parser.add_argument("--run-for", default="120s")
    args = parser.parse_args()
    kubeconfig = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "up"], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    os.environ["BENCH_KUBECONFIG"] = kubeconfig
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}})
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait"], check=True,
                   capture_output=True)
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)

    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(kubeconfig))
    names = {f"bench-{i}" for i in range(args.jobs)}
    completed_at: dict[str, float] = {}
    watcher = threading.Thread(target=observer, args=(names, completed_at), daemon=True)
    watcher.start()
    results: dict[str, dict[str, dict]] = {"ours": {}, "poll": {}}
    threads = []
    for name in sorted(names):
        body = master_only_job(name, {"run-for": args.run_for})
        api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", body)
    time.sleep(0.5)
    for name in sorted(names):
        for kind, target in (("ours", ours), ("poll", polling_loop)):
            results[kind][name] = {}
            thread = threading.Thread(target=target, args=(name, results[kind][name]))
            thread.start()
            threads.append(thread)
    for thread in threads:
        thread.join()
    watcher.join(timeout=30)

    print(f"{args.jobs} Jobs running {args.run_for}, both waiters on each Job at once")
    print(f"{'waiter':34} {'latency median':>15} {'latency max':>12} {'requests/job-min':>17}")
    for kind, label in (("ours", "airflow-volcano (watch)"), ("poll", "10 s polling loop (cncf Spark launcher)")):
        latencies = [r["returned"] - completed_at[n] for n, r in results[kind].items() if n in completed_at]
        rate = sum(r["requests"] for r in results[kind].values()) / (
            sum(r["waited"] for r in results[kind].values()) / 60)
        print(f"{label:34} {statistics.median(latencies):14.2f}s {max(latencies):11.2f}s {rate:17.2f}")
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait=false"], capture_output=True)


if __name__ == "__main__":
    main()
