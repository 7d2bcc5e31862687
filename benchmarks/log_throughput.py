"""Log throughput: copying a master's large log into the task log, ours against cncf's
`PodManager.fetch_container_logs` (what KubernetesPodOperator uses), on the same pod.

A real container on the local cluster's real node (scripts/volcano-cluster up) writes `--lines`
lines of training output and exits. Each reader then copies that whole log, in a fresh
interpreter of its own, into a logger that formats every line as the task log would and writes
it to /dev/null. Figures per reader: lines per second and the growth of its peak RSS while copying.

- cncf: `PodManager(CoreV1Api).fetch_container_logs(pod, container, follow=True)`;
- ours, worker: the operator's `LogFollower` on a following stream (non-deferrable tasks);
- ours, triggerer: `VolcanoJobTrigger`'s incremental copy (one read streamed in 64 KiB chunks),
  i.e. what the triggerer holds in memory while a deferred task's log is copied.

The container log stays under the kubelet's 10 MiB rotation size, so every reader sees all of it.

    .venv/bin/python benchmarks/log_throughput.py [--lines 60000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import structlog
from common import rss_mib

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench-logs"
JOB = "logbench"
POD = f"{JOB}-master-0"  # the name JobRef gives the master pod of Job `logbench`
CONTAINER = "master"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Counter:
    """The last structlog processor: renders each event as a JSON line, as Airflow's task log does,
    and counts the copied lines."""

    def __init__(self) -> None:
        self.lines = 0
        self.render = structlog.processors.JSONRenderer()

    def __call__(self, logger: object, method: str, event: dict) -> str:
        if "step " in str(event.get("event", "")):
            self.lines += 1
        return self.render(logger, method, event)


def read_with(reader: str, kubeconfig: str, lines: int) -> dict:
    """One reader copying the whole log (run in its own interpreter)."""
    os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"] = json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": kubeconfig}})
    # Every reader's modules first: importing Airflow sets up its logging, which this replaces.
    import airflow.providers.cncf.kubernetes.utils.pod_manager  # noqa: F401

    import airflow_volcano.hooks.volcano  # noqa: F401
    import airflow_volcano.triggers.job  # noqa: F401

    counter = Counter()
    # Airflow's loggers are structlog's: every reader's lines go through the same processors.
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.TimeStamper(fmt="iso"),
                    structlog.stdlib.PositionalArgumentsFormatter(), counter],
        logger_factory=structlog.WriteLoggerFactory(file=open(os.devnull, "w")),  # noqa: SIM115
        cache_logger_on_first_use=True,
    )
    if reader == "cncf":
        from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
        from kubernetes import client, config

        core = client.CoreV1Api(config.new_client_from_config(kubeconfig))
        pod = core.read_namespaced_pod(POD, NAMESPACE)
        manager = PodManager(core)
        baseline, started = rss_mib(), time.monotonic()
        # Its default stops reading a container that ended over 120 s ago: the rounds take longer.
        manager.fetch_container_logs(pod, CONTAINER, follow=True, post_termination_timeout=3600)
    elif reader == "worker":
        from airflow_volcano.hooks.volcano import VolcanoHook
        from airflow_volcano.observability.logs import LogCursor, LogFollower

        hook = VolcanoHook()
        log = structlog.get_logger("airflow.task")

        def open_stream(since: float | None) -> object:
            return hook.stream_pod_log(POD, NAMESPACE, container=CONTAINER, since=since)

        from airflow_volcano.observability.pod_logs import pod_line_emit

        follower = LogFollower(open_stream, LogCursor(), pod_line_emit(log, POD))
        baseline, started = rss_mib(), time.monotonic()
        follower.start()
        while counter.lines < lines and time.monotonic() - started < 600:
            time.sleep(0.01)
        follower.stop()
    else:
        import asyncio

        from airflow_volcano.job_ref import JobRef
        from airflow_volcano.observability.logs import LogCursor
        from airflow_volcano.observability.masking import JobSecrets
        from airflow_volcano.triggers.job import VolcanoJobTrigger, _LogCopy
        from airflow_volcano.waiting.wait_engine import OutputClock

        ref = JobRef(name=JOB, namespace=NAMESPACE, main_container=CONTAINER)
        trigger = VolcanoJobTrigger(ref.to_dict(), "kubernetes_default")

        async def copy() -> float:
            hook = await trigger._hook()
            trigger._secrets = JobSecrets()
            start = time.monotonic()
            await trigger._copy_new_lines(hook, NAMESPACE, _LogCopy(ref.main_pod, CONTAINER, LogCursor()),
                                          OutputClock())
            return start

        baseline = rss_mib()
        started = asyncio.run(copy())
    seconds = time.monotonic() - started
    return {"lines": counter.lines, "seconds": seconds, "rss_growth_mib": peak_rss_mib() - baseline}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reader", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reader:
        print(json.dumps(read_with(args.reader, args.kubeconfig, args.lines)))
        return
    kubeconfig = subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "up"], capture_output=True, text=True,
                                check=True).stdout.strip().splitlines()[-1]
    real_node = json.loads(subprocess.run([str(REPO / "scripts" / "volcano-cluster"), "real-node"],
                                          capture_output=True, text=True, check=True).stdout)
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait"], capture_output=True)
    subprocess.run([*kubectl, "create", "namespace", NAMESPACE], check=True, capture_output=True)
    # Training-like lines of ~70 bytes, written as fast as Python prints them.
    write = (f"import sys\nfor i in range({args.lines}):\n"
             "    sys.stdout.write(f'step {i} loss {1 / (i + 1):.6f} lr 0.001 ' + 'x' * 30 + '\\n')\n")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": NAMESPACE},
           "spec": {"restartPolicy": "Never", "schedulerName": "volcano", "nodeSelector": real_node["node_selector"],
                    "tolerations": real_node["tolerations"],
                    "containers": [{"name": CONTAINER, "image": real_node["image"],
                                    "imagePullPolicy": real_node["image_pull_policy"],
                                    "command": ["python3", "-c", write]}]}}
    subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps(pod), text=True, check=True, capture_output=True)
    subprocess.run([*kubectl, "wait", "-n", NAMESPACE, f"pod/{POD}", "--for=jsonpath={.status.phase}=Succeeded",
                    "--timeout=300s"], check=True, capture_output=True)
    results: dict[str, list[dict]] = {"cncf": [], "worker": [], "trigger": []}
    for _ in range(args.rounds):
        for reader in results:
            out = subprocess.run([sys.executable, __file__, "--reader", reader, "--kubeconfig", kubeconfig,
                                  "--lines", str(args.lines)], capture_output=True, text=True, check=True).stdout
            results[reader].append(json.loads(out.strip().splitlines()[-1]))
    labels = {"cncf": "cncf PodManager.fetch_container_logs", "worker": "airflow-volcano, worker (LogFollower)",
              "trigger": "airflow-volcano, triggerer (streamed read)"}
    print(f"a finished master's log of {args.lines} lines, each reader {args.rounds} times (median)")
    print(f"{'reader':44} {'lines copied':>12} {'lines/s':>9} {'peak RSS growth':>16}")  # copied: min-max
    for reader, runs in results.items():
        rate = statistics.median(run["lines"] / run["seconds"] for run in runs)
        growth = statistics.median(run["rss_growth_mib"] for run in runs)
        copied = f"{min(run['lines'] for run in runs)}-{max(run['lines'] for run in runs)}"
        print(f"{labels[reader]:44} {copied:>12} {rate:9.0f} {growth:13.1f} MiB")
    subprocess.run([*kubectl, "delete", "namespace", NAMESPACE, "--wait=false"], capture_output=True)


if __name__ == "__main__":
    main()
