"""Waiting on a Volcano Job: our two waits vs a 10 s polling loop, side by side.

The peer is the loop cncf's SparkKubernetesOperator launcher uses: GET the custom object, sleep
10 s, repeat. All wait on the same Jobs (kwok pods) on the local cluster (scripts/volcano-cluster
up), at the same time:
  - the worker's wait (a task that does not defer): each Job alone, its own client and watch;
  - deferred: one VolcanoJobTrigger per Job, all in one event loop as in a triggerer, sharing
    one watch of the namespace's Jobs (and of pods while Jobs start);
  - the polling loop, one per Job.
Figures:
  - completion latency: from the moment the Job turns Completed (seen by an independent watch)
    to the moment each waiter returns;
  - API requests per waiting job-minute, counted at each waiter's ApiClient (the triggers': every
    HTTP request of their event loop, divided among the Jobs).

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
    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.waiting.wait_engine import WaitLimits
    from airflow_volcano.waiting.wait_worker import wait_for_job

    hook = counting_hook()
    ref = JobRef.from_job(hook.get_job(name, NAMESPACE), "master")
    hook.requests = 0
    start = time.time()
    wait_for_job(hook, ref, WaitLimits(startup_timeout=600))
    out.update(returned=time.time(), requests=hook.requests, waited=time.time() - start)


def triggers(names: list[str], results: dict[str, dict]) -> None:
    """Every Job waited by its own VolcanoJobTrigger, all in one event loop (as in a triggerer)."""
    import asyncio

    from kubernetes_asyncio.client import rest

    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    hook = VolcanoHook()
    refs = {name: JobRef.from_job(hook.get_job(name, NAMESPACE), "master").to_dict() for name in names}
    requests = 0
    original = rest.RESTClientObject.request

    async def request(self, *args, **kwargs):
        nonlocal requests
        requests += 1
        return await original(self, *args, **kwargs)

    rest.RESTClientObject.request = request  # only the triggers use the asyncio client here

    async def wait(name: str) -> None:
        start = time.time()
        await anext(VolcanoJobTrigger(refs[name], "kubernetes_default", get_logs=False).run())
        results[name].update(returned=time.time(), waited=time.time() - start)

    async def wait_all() -> None:
        await asyncio.gather(*(wait(name) for name in names))

    asyncio.run(wait_all())
    for name in names:
        results[name]["requests"] = requests / len(names)


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
    results: dict[str, dict[str, dict]] = {"ours": {}, "triggers": {}, "poll": {}}
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
    results["triggers"] = {name: {} for name in sorted(names)}
    threads.append(threading.Thread(target=triggers, args=(sorted(names), results["triggers"])))
    threads[-1].start()
    for thread in threads:
        thread.join()
    watcher.join(timeout=30)

    print(f"{args.jobs} Jobs running {args.run_for}, the three waiters on each Job at once")
    print(f"{'waiter':42} {'latency median':>15} {'latency max':>12} {'requests/job-min':>17}")
    for kind, label in (("ours", "airflow-volcano, worker (own watch)"),
                        ("triggers", "airflow-volcano, deferred (shared watch)"),
                        ("poll", "10 s polling loop (cncf Spark launcher)")):
        latencies = [r["returned"] - completed_at[n] for n, r in results[kind].items() if n in completed_at]
        rate = sum(r["requests"] for r in results[kind].values()) / (
            sum(r["waited"] for r in results[kind].values()) / 60)
        print(f"{label:42} {statistics.median(latencies):14.2f}s {max(latencies):11.2f}s {rate:17.2f}")
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait=false"], capture_output=True)


if __name__ == "__main__":
    main()
