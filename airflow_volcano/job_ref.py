"""JobRef: what identifies a submitted Volcano Job and how to read it; a typed value that travels
between the worker and the triggerer as `to_dict()`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from airflow_volcano.constants import TRY_NUMBER_LABEL
from airflow_volcano.manifest.names import pod_name
from airflow_volcano.timestamps import parse_time


@dataclass(frozen=True)
class JobRef:
    """A Job, and its main pod: pod 0 of `main_task`, whose log is followed and whose termination
    message is the task's result (the master's, for PyTorch and DeepSpeed Jobs)."""

    name: str
    namespace: str
    main_task: str = "master"
    uid: str | None = None
    created_at: float | None = None  # epoch seconds (the Job's creationTimestamp)
    script_configmap: str | None = None
    owned: bool = True  # submitted by this task (the sensor watches Jobs that are not)
    # The main task's first container, read from the Job: a template may name it anything.
    main_container: str | None = None
    # The try of the task instance that owns the Job (its try-number label): the one that created it, or
    # the last to reattach. A kill deletes the Job only while that try still owns it.
    owner_try: int | None = None

    @property
    def main_pod(self) -> str:
        return pod_name(self.name, self.main_task)

    @property
    def main_pod_container(self) -> str:
        """The container whose log and termination message are read (named like the task if unknown)."""
        return self.main_container or self.main_task

    @classmethod
    def from_job(cls, job: dict, main_task: str, script_configmap: str | None = None) -> JobRef:
        metadata = job["metadata"]
        created = metadata.get("creationTimestamp")
        return cls(
            name=metadata["name"],
            namespace=metadata["namespace"],
            main_task=main_task,
            uid=metadata.get("uid"),
            created_at=parse_time(created),
            script_configmap=script_configmap,
            main_container=first_container(job, main_task),
            owner_try=owning_try(job),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobRef:
        return cls(**data)


def owning_try(job: dict) -> int | None:
    """The try of its task instance that owns a Job: the one that created it, or the last to reattach."""
    value = ((job.get("metadata") or {}).get("labels") or {}).get(TRY_NUMBER_LABEL, "")
    return int(value) if str(value).isdigit() else None


def first_container(job: dict, task_name: str) -> str | None:
    """The name of the first container of a task's pod template, if the Job has that task."""
    for task in (job.get("spec") or {}).get("tasks") or []:
        if task.get("name") == task_name:
            containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or []
            return containers[0].get("name") if containers else None
    return None
