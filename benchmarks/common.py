"""What the benchmarks share: the one-pod Volcano Job they wait on, and reading our own memory."""

from __future__ import annotations

from pathlib import Path


def master_only_job(name: str, sim: dict[str, str], *, plugins: bool = True) -> dict:
    """A PyTorch Volcano Job with just its master; `sim` tells kwok what the pod does. Without
    `plugins` (no pytorch/svc: no Service, ConfigMap or env per Job) Volcano creates it 3x faster."""
    job = {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano", "minAvailable": 1,
            "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": []},
            "tasks": [{"name": "master", "replicas": 1,
                       "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                       "template": {"metadata": {"annotations": {f"sim.airflow-volcano.io/{key}": value
                                                                 for key, value in sim.items()}},
                                    "spec": {"containers": [{"name": "master", "image": "img"}],
                                             "restartPolicy": "Never"}}}],
        },
    }
    if not plugins:
        del job["spec"]["plugins"]
    return job


def rss_mib() -> float:
    """This process's resident memory now."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0
