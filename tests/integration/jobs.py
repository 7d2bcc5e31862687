"""Volcano Job bodies the tests submit "from outside Airflow" (as a user with kubectl would)."""

from __future__ import annotations

from typing import Any

SIM = "sim.airflow-volcano.io/"


def pytorch_job(name: str, *, workers: int = 1, master_sim: dict[str, str] | None = None,
                worker_sim: dict[str, str] | None = None, max_retry: int = 0) -> dict[str, Any]:
    """A minimal PyTorch Volcano Job; `*_sim` choose what kwok makes the pods do."""

    def task(task_name: str, replicas: int, sim: dict[str, str] | None, policies: list | None = None) -> dict:
        spec: dict[str, Any] = {
            "name": task_name,
            "replicas": replicas,
            "template": {
                "metadata": {"annotations": {SIM + key: value for key, value in (sim or {}).items()}},
                "spec": {
                    "containers": [{"name": task_name, "image": "pytorch/pytorch:2.7.1", "command": ["true"]}],
                    "restartPolicy": "Never",
                },
            },
        }
        if policies:
            spec["policies"] = policies
        return spec

    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": 1 + workers,
            "maxRetry": max_retry,
            "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"], "svc": []},
            "policies": [{"event": "PodFailed", "action": "AbortJob"}],
            "tasks": [
                task("master", 1, master_sim, [{"event": "TaskCompleted", "action": "CompleteJob"}]),
                task("worker", workers, worker_sim),
            ],
        },
    }
