"""Triggerer capacity: one asyncio event loop (as in Airflow's triggerer) running VolcanoJobTrigger
for N Running Volcano Jobs at once. Prints the loop's memory and CPU while they all wait, and the
apiserver's requests about Jobs per minute (its own apiserver_request_total counter).

Side by side, in the same script and loop: `--design shared` (VolcanoJobTrigger: one watch of the
namespace's Jobs shared by every trigger) and `--design per-trigger` (the design before it: each
waiter its own client and its own field-selected watch of its Job, reopened every 5 minutes).

Uses the local cluster (scripts/volcano-cluster up); adds kwok nodes so N pods fit. The Jobs have
no plugins (the trigger does not care, and Volcano creates them 3x faster): 1,000 take about a
minute and a half to be Running here. On this 2-core machine Volcano brings only about 130 Jobs a
minute to Running once thousands wait, so for 10,000 use `--status-by benchmark`: Volcano's
controller and scheduler are paused (SIGSTOP) while the benchmark creates the Jobs and writes
each one's status as Volcano writes a Running one-pod Job's (as kwok writes pod status for
kubelets); the triggers read the same objects from the same apiserver either way. With
`--leave-jobs` the Jobs stay for another run; `scripts/volcano-cluster down` drops them.

With `--in-queue` the Jobs wait instead of running: each asks 1 CPU of a queue whose capability (1 CPU)
a running Job holds, so every trigger reports why its Job waits (its queue, its position among the
N waiting, the short CPU) from the triggerer's shared queue, PodGroup and PriorityClass caches.

    .venv/bin/python benchmarks/triggerer_capacity.py [--jobs 1000] [--seconds 60] [--design shared]
                                                      [--status-by volcano|benchmark] [--leave-jobs]
                                                      [--node-lost-timeout 180|none] [--in-queue]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import master_only_job, rss_mib

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench-triggerer"
QUEUE = "bench-full"  # --in-queue: the queue every Job waits in


def running_status(now: str) -> dict:
    """The status Volcano's controller writes for a Running Job of one running pod."""
    return {"state": {"phase": "Running", "lastTransitionTime": now}, "minAvailable": 1, "running": 1,
            "taskStatusCount": {"master": {"phase": {"Running": 1}}},
            "conditions": [{"status": "Pending", "lastTransitionTime": now},
                           {"status": "Running", "lastTransitionTime": now}]}


def signal_volcano(signum: int) -> None:
    """Pause (SIGSTOP) or resume (SIGCONT) Volcano's controller and scheduler."""
    pids = Path(os.environ.get("VOLCANO_CLUSTER_STATE", "/tmp/airflow-volcano-cluster")) / "pids"
    for name in ("vc-controller-manager", "vc-scheduler"):
        os.kill(int((pids / f"{name}.pid").read_text().split()[0]), signum)  # "<pid> <binary>"


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def per_trigger_watch(ref: dict, kubernetes_conn_id: str) -> dict:
    """The design before the shared watch: its own client, a GET, then a watch of its one Job."""
    from kubernetes_asyncio import client as async_client
    from kubernetes_asyncio import watch as async_watch

    from airflow_volcano.hooks import calls
    from airflow_volcano.hooks.volcano import AsyncVolcanoHook

    hook = AsyncVolcanoHook(kubernetes_conn_id)
    job = await hook.run(calls.get_job(ref["name"], ref["namespace"]))
    while True:
        async with hook.get_conn() as api:
            async with async_watch.Watch().stream(
                async_client.CustomObjectsApi(api).list_namespaced_custom_object, "batch.volcano.sh", "v1alpha1",
                ref["namespace"], "jobs", field_selector=f"metadata.name={ref['name']}",
                resource_version=job["metadata"]["resourceVersion"], timeout_seconds=300, _request_timeout=310,
            ) as events:
                async for event in events:
                    job = event["object"]
                    if (job.get("status") or {}).get("state", {}).get("phase") == "Completed":
                        return {"status": "finished", "phase": "Completed"}


def apiserver_job_requests(kubectl: list[str]) -> dict[str, float]:
    """The apiserver's own count of requests about Volcano Jobs and about pods, by verb."""
    metrics = subprocess.run([*kubectl, "get", "--raw", "/metrics"], capture_output=True, text=True,
                             check=True).stdout
    counts: dict[str, float] = {}
    for line in metrics.splitlines():
        if 'group="batch.volcano.sh"' in line and 'resource="jobs"' in line:
            kind = "Jobs"
        elif 'group=""' in line and 'resource="pods"' in line and 'subresource=""' in line:
            kind = "pods"
        elif 'group="scheduling.volcano.sh"' in line and ('resource="podgroups"' in line
                                                         or 'resource="queues"' in line):
            kind = "PodGroups" if 'resource="podgroups"' in line else "queues"
        elif 'group=""' in line and 'resource="events"' in line:
            kind = "events"
        else:
            continue
        if line.startswith("apiserver_request_total{"):  # a watch is counted when it ends
            verb = line.split('verb="', 1)[1].split('"', 1)[0]
            counts[f"{kind} {verb}"] = counts.get(f"{kind} {verb}", 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            counts[f"open watches of {kind}"] = counts.get(f"open watches of {kind}", 0.0) + float(
                line.rsplit(" ", 1)[1])
    return counts


async def settled(kubectl: list[str], limit: float = 120) -> dict[str, float]:
    """The apiserver's counts once the start-up burst is over: no new request about Jobs for 5 s, or
    `limit` seconds (waiting Jobs are looked at every minute: their requests never stop)."""
    def requests(counts: dict[str, float]) -> float:
        return sum(count for verb, count in counts.items() if not verb.startswith("open watches"))

    await asyncio.sleep(10)
    deadline = time.monotonic() + limit
    counts = await asyncio.to_thread(apiserver_job_requests, kubectl)
    while True:
        await asyncio.sleep(5)
        now = await asyncio.to_thread(apiserver_job_requests, kubectl)
        if requests(now) == requests(counts) or time.monotonic() > deadline:
            return now
        counts = now


def running_jobs(api, expected: int, limit_seconds: float, phase: str = "Running") -> list[dict]:
    """The namespace's Jobs in `phase` (the benchmark's own, `cap-*`), once all `expected` are (or the time
    is up); read page by page. Pending ones are counted once Volcano has made their PodGroup."""
    started = time.monotonic()
    while True:
        running, token = [], None
        podgroups = {group["metadata"]["ownerReferences"][0]["name"] for group in api.list_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", NAMESPACE, "podgroups")["items"]} if phase == "Pending" else set()
        while True:
            page = api.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", limit=500,
                                                     **({"_continue": token} if token else {}))
            running += [job for job in page["items"] if job["metadata"]["name"].startswith("cap-")
                        and (job.get("status") or {}).get("state", {}).get("phase") == phase
                        and (phase != "Pending" or job["metadata"]["name"] in podgroups)]
            if not (token := page["metadata"].get("continue")):
                break
        if len(running) == expected or time.monotonic() - started > limit_seconds:
            return running
        time.sleep(10)


async def watch_all(refs: list[dict], kubernetes_conn_id: str, seconds: float, design: str, kubectl: list[str],
                    limits: dict) -> dict:
    import airflow_volcano.hooks.volcano  # noqa: F401 - the clients' one-time import is not the waiters' memory
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    logging.getLogger("airflow_volcano").setLevel(logging.WARNING)  # 2 lines per trigger otherwise
    baseline = rss_mib()
    if design == "shared":
        waits = [anext(VolcanoJobTrigger(ref, kubernetes_conn_id, limits=limits, get_logs=False).run())
                 for ref in refs]
    else:
        waits = [per_trigger_watch(ref, kubernetes_conn_id) for ref in refs]
    tasks = [asyncio.create_task(wait) for wait in waits]
    started = time.monotonic()
    before = await settled(kubectl)
    print(f"  every waiter has read its Job {time.monotonic() - started:.0f}s after the start", flush=True)
    cpu0, t0, rss_after_start = cpu_seconds(), time.monotonic(), rss_mib()
    await asyncio.sleep(seconds)
    cpu = (cpu_seconds() - cpu0) / (time.monotonic() - t0)
    after = await asyncio.to_thread(apiserver_job_requests, kubectl)
    per_minute = {verb: (after.get(verb, 0) - before.get(verb, 0)) * 60 / seconds for verb in after
                  if not verb.startswith("open watches")}
    open_watches = {verb: count for verb, count in after.items() if verb.startswith("open watches")}
    finished = [getattr(task.result(), "payload", task.result()) for task in tasks
                if task.done() and not task.cancelled() and task.exception() is None]
    reasons = sorted({f"{p['status']}: {p.get('message', p.get('phase'))}"[:200] for p in finished})
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {"baseline_mib": baseline, "rss_mib": rss_after_start, "peak_mib": rss_mib(), "cpu": cpu,
            "finished_early": len(finished), "reasons": reasons, "requests_per_minute": per_minute,
            "open_watches": open_watches}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--design", choices=["shared", "per-trigger"], default="shared")
    parser.add_argument("--node-lost-timeout", default="180",
                        help="the triggers' node_lost_timeout in seconds (the operator's default), or none")
    parser.add_argument("--leave-jobs", action="store_true", help="do not delete the Jobs and nodes afterwards")
    parser.add_argument("--status-by", choices=["volcano", "benchmark"], default="volcano",
                        help="who makes the Jobs Running: Volcano, or the benchmark with Volcano paused")
    parser.add_argument("--in-queue", action="store_true",
                        help="the Jobs wait in a full queue (Volcano makes their PodGroups) instead of running")
    args = parser.parse_args()
    if args.in_queue and args.status_by == "benchmark":
        parser.error("--in-queue needs Volcano running (--status-by volcano): it makes the PodGroups")
    phase = "Pending" if args.in_queue else "Running"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one connection per watch
    kubeconfig = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "up"], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    from kubernetes import client, config

    api = client.CustomObjectsApi(config.new_client_from_config(kubeconfig))
    started = time.monotonic()
    # The Jobs a run with --leave-jobs left are used again when they are as many as asked for.
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], capture_output=True)
    if args.in_queue:
        fill_queue(api, kubectl)
    running = running_jobs(api, args.jobs, limit_seconds=0, phase=phase)
    if len(running) != args.jobs:
        subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait", "--timeout=1800s"],
                       capture_output=True)
        subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
        if args.in_queue:
            fill_queue(api, kubectl)
    nodes = [{"apiVersion": "v1", "kind": "Node",
              "metadata": {"name": f"bench-node-{i}", "annotations": {"kwok.x-k8s.io/node": "fake"}},
              "status": {"allocatable": {"cpu": "1000", "memory": "4Ti", "pods": "250"},
                         "capacity": {"cpu": "1000", "memory": "4Ti", "pods": "250"}}}
             for i in range(args.jobs // 250 + 1)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": nodes}), text=True, check=True,
                   capture_output=True)

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def create(i: int) -> None:
        body = master_only_job(f"cap-{i}", {"outcome": "run-forever"}, plugins=False)
        if args.in_queue:
            in_queue(body)
        api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", body)
        if args.status_by == "benchmark":
            api.patch_namespaced_custom_object_status("batch.volcano.sh", "v1alpha1", NAMESPACE, "jobs", f"cap-{i}",
                                                      {"status": running_status(now)})

    if args.status_by == "benchmark":
        signal_volcano(signal.SIGSTOP)
    try:
        if len(running) != args.jobs:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(create, range(args.jobs)))
            running = running_jobs(api, args.jobs, limit_seconds=300 + args.jobs * 0.2, phase=phase)
        print(f"{len(running)}/{args.jobs} Jobs {phase} after {time.monotonic() - started:.0f}s", flush=True)
        run_and_report(args, running, kubeconfig, kubectl)
    finally:
        if args.status_by == "benchmark":
            signal_volcano(signal.SIGCONT)
    if args.leave_jobs:
        return
    # The namespace first: kwok must still manage the nodes to finish deleting their pods.
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait", "--timeout=600s"], capture_output=True)
    subprocess.run([*kubectl, "delete", "node", *[n["metadata"]["name"] for n in nodes], "--wait=false"],
                   capture_output=True)
    if args.in_queue:
        close_and_delete_queue(api, kubectl)


def in_queue(body: dict) -> dict:
    """A Job of the full queue, asking its whole capability."""
    body["spec"]["queue"] = QUEUE
    body["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    return body


def fill_queue(api, kubectl: list[str]) -> None:
    """The queue of capability 1 CPU, and a Job holding it (running until the namespace goes)."""
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps({
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": QUEUE},
        "spec": {"capability": {"cpu": "1"}, "reclaimable": False}}), text=True, check=True, capture_output=True)
    subprocess.run([*kubectl, "apply", "-n", NAMESPACE, "-f", "-"], text=True, check=True, capture_output=True,
                   input=json.dumps(in_queue(master_only_job("holder", {"outcome": "run-forever"}, plugins=False))))


def close_and_delete_queue(api, kubectl: list[str]) -> None:
    queue = api.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", QUEUE)
    subprocess.run([*kubectl, "create", "-n", "default", "-f", "-"], text=True, capture_output=True, input=json.dumps({
        "apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command", "metadata": {"generateName": "close-bench-"},
        "action": "CloseQueue", "target": {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                                           "name": QUEUE, "uid": queue["metadata"]["uid"]}}))
    time.sleep(5)
    subprocess.run([*kubectl, "delete", "queue", QUEUE, "--wait=false"], capture_output=True)


def run_and_report(args: argparse.Namespace, running: list[dict], kubeconfig: str, kubectl: list[str]) -> None:
    from airflow_volcano.job_ref import JobRef

    refs = [JobRef.from_job(job, "master").to_dict() for job in running]
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}})
    from airflow_volcano.waiting.wait_engine import WaitLimits

    # The operator's default node_lost_timeout keeps each trigger's pods followed while its Job runs; a
    # waiting Job waits as long as it takes (no startup_timeout).
    limits = WaitLimits(node_lost_timeout=None if args.node_lost_timeout == "none"
                        else float(args.node_lost_timeout), startup_timeout=None if args.in_queue else 900).to_dict()
    result = asyncio.run(watch_all(refs, "kubernetes_default", args.seconds, args.design, kubectl, limits))
    what = "Jobs waiting in a full queue" if args.in_queue else "Running Jobs"
    print(f"one event loop, {len(refs)} waiters ({args.design} watch) on {what} for {args.seconds:.0f}s:")
    print(f"  RSS: {result['baseline_mib']:.0f} MiB before, {result['rss_mib']:.0f} MiB with all watching "
          f"({(result['rss_mib'] - result['baseline_mib']) * 1024 / max(1, len(refs)):.0f} KiB per trigger), "
          f"peak {result['peak_mib']:.0f} MiB")
    print(f"  CPU: {result['cpu'] * 100:.1f}% of one core while waiting; {result['finished_early']} fired early")
    requests = result["requests_per_minute"]
    print(f"  apiserver requests about Jobs and pods: {sum(requests.values()):.1f}/min "
          f"({', '.join(f'{verb} {rate:.1f}' for verb, rate in sorted(requests.items()) if rate)}); open: "
          f"{', '.join(f'{count:.0f} {what}' for what, count in sorted(result['open_watches'].items()))}")
    for reason in result["reasons"]:
        print(f"    fired: {reason}")


if __name__ == "__main__":
    main()
