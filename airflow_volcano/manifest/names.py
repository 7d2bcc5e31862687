"""Names in a Job: the Job's own (a DNS label that keeps every pod name a hostname), the labels that
name a task instance across its tries, and the tasks a Job's parts are found by."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from airflow_volcano.constants import IDENTITY_KEYS, LABEL_PREFIX, MANAGED_BY_LABEL, MANAGED_BY_VALUE, TRY_NUMBER_LABEL

if TYPE_CHECKING:
    from airflow_volcano.manifest.request import JobRequest

# The roles of a master/worker Job (Volcano's pytorch plugin's defaults), and the task `tensorboard=` adds
# (outside the gang and the ranks, restarted alone if it fails).
DEFAULT_MASTER, DEFAULT_WORKER = "master", "worker"
TENSORBOARD_TASK = "tensorboard"

JOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
LABEL_PREFIX_PART = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")
POD_NAME_MAX = 63  # the pod name is also its hostname (svc plugin), so a DNS label


def _short_hash(value: str, length: int = 6) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def sanitize_label_value(value: str) -> str:
    """A valid label value; long or rewritten values keep a hash so distinct inputs stay distinct."""
    value = str(value)
    if len(value) <= 63 and LABEL_VALUE.match(value):
        return value
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", value).strip("._-")[: 63 - 7].strip("._-")
    return f"{cleaned}-{_short_hash(value)}" if cleaned else _short_hash(value)


def sanitize_dns_label(value: str, max_len: int) -> str:
    """Lowercase, `_`/`.` -> `-`, other invalid characters dropped, starting with a letter."""
    cleaned = re.sub(r"[^a-z0-9-]", "", re.sub(r"[_.\s]", "-", str(value).lower()))
    cleaned = re.sub(r"-+", "-", cleaned).strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = f"j-{cleaned}".rstrip("-")
    return cleaned[: max(1, max_len)].rstrip("-")


def pod_name(job_name: str, task: str, index: int = 0) -> str:
    """Volcano's name for pod `index` of a Job's task, `<job>-<task>-<index>`: also its hostname."""
    return f"{job_name}-{task}-{index}"


def pod_task(job_name: str, pod: str) -> str | None:
    """The task of one of the Job's pods, read back from its name (`pod_name`); None if it is not one."""
    prefix = f"{job_name}-"
    task, _, index = pod.removeprefix(prefix).rpartition("-")
    return task if pod.startswith(prefix) and task and index.isdigit() else None


def max_job_name_length(task_names: list[str], max_index: int) -> int:
    """Longest Job name for which every pod name `<job>-<task>-<index>` is a valid hostname."""
    longest = max((len(name) for name in task_names), default=0)
    return POD_NAME_MAX - longest - len(str(max(0, max_index))) - 2


def default_job_name(dag_id: str, task_id: str, *, suffix: str, max_len: int) -> str:
    """`<dag_id>-<task_id>` shortened to leave room for `-<suffix>` (which keeps reruns distinct)."""
    suffix = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "", str(suffix).lower())).strip("-")
    if not suffix:
        return sanitize_dns_label(f"{dag_id}-{task_id}", max_len)
    return f"{sanitize_dns_label(f'{dag_id}-{task_id}', max_len - len(suffix) - 1)}-{suffix}"


def run_labels(*, dag_id: str, task_id: str, run_id: str, try_number: int, map_index: int) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        f"{LABEL_PREFIX}dag-id": sanitize_label_value(dag_id),
        f"{LABEL_PREFIX}task-id": sanitize_label_value(task_id),
        f"{LABEL_PREFIX}run-id": sanitize_label_value(run_id),
        f"{LABEL_PREFIX}map-index": str(map_index) if map_index >= 0 else "none",  # "-1" is no label value
        TRY_NUMBER_LABEL: str(try_number),
    }


def checkpoint_subdir(*, dag_id: str, task_id: str, run_id: str, map_index: int) -> str:
    """The task instance's directory under checkpoint_dir: `<dag_id>/<task_id>[-<map_index>]/<run_id>`,
    the same for every try (and every restart) of it. A part with characters other than letters,
    digits and `._-` has them replaced and keeps a hash of the original, so distinct runs stay distinct."""
    def part(value: str) -> str:
        cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", value).lstrip(".")[:100]
        return cleaned if cleaned == value and cleaned else f"{cleaned}-{_short_hash(value)}"

    task = task_id if map_index < 0 else f"{task_id}-{map_index}"
    return "/".join(part(str(value)) for value in (dag_id, task, run_id))


def identity_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """run_labels minus the try number: finds this task instance's Job across its tries."""
    return {key: labels[key] for key in IDENTITY_KEYS if key in labels}


def script_configmap_name(job_name: str) -> str:
    return f"{job_name}-script"


def name_limit(job: dict) -> int | None:
    """Longest Job name that keeps every `<job>-<task>-<last index>` within 63 characters."""
    limits = [max_job_name_length([task["name"]], task["replicas"] - 1)
              for task in (job.get("spec") or {}).get("tasks") or []
              if isinstance(task, dict) and isinstance(task.get("name"), str) and isinstance(task.get("replicas"), int)]
    return min(limits) if limits else None


def fit_default_name(default_name: str, job: dict) -> str:
    """The caller sized the default for its task names; a template's may be longer: shorten, keep the suffix."""
    limit = name_limit(job)
    if limit is None or len(default_name) <= limit or "-" not in default_name:
        return default_name
    base, suffix = default_name.rsplit("-", 1)
    return default_job_name(base, "", suffix=suffix, max_len=limit)


def plugin_arg(job: dict, flag: str) -> str | None:
    for arg in ((job.get("spec") or {}).get("plugins") or {}).get("pytorch") or []:
        if str(arg).startswith(f"--{flag}="):
            return str(arg).split("=", 1)[1]
    return None


def find_task(job: dict, name: str) -> dict | None:
    tasks = (job.get("spec") or {}).get("tasks") or []
    return next((task for task in tasks if isinstance(task, dict) and task.get("name") == name), None)


def role_names(job: dict, req: JobRequest) -> tuple[str, str]:
    master = req.master_task_name or plugin_arg(job, "master") or DEFAULT_MASTER
    worker = req.worker_task_name or plugin_arg(job, "worker") or DEFAULT_WORKER
    return master, worker
