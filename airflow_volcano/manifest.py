"""Operator arguments -> a validated Volcano Job manifest (and the training-script ConfigMap).

Pure: no Airflow, no network. Precedence: an explicit argument overrides `job_template`, which
overrides the built-in defaults; defaults are never injected into a template, so a template
submits as written apart from our labels. Every error names the parameter and the bad value.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import yaml

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "airflow-volcano"
LABEL_PREFIX = "airflow-volcano.io/"
TRY_NUMBER_LABEL = f"{LABEL_PREFIX}try-number"
# Set on a Job once a try has reported its result, so later tries never mistake it for theirs.
CHECKED_LABEL = f"{LABEL_PREFIX}checked"
SCRIPT_MOUNT_PATH = "/opt/airflow-volcano/script"
SCRIPT_VOLUME = "training-script"
API_VERSION = "batch.volcano.sh/v1alpha1"
MAX_CONFIGMAP_BYTES = 1024 * 1024
POD_NAME_MAX = 63

DEFAULT_MASTER, DEFAULT_WORKER, DEFAULT_PORT = "master", "worker", 23456
DEFAULT_MASTER_POLICIES = [{"event": "TaskCompleted", "action": "CompleteJob"}]
# DDP cannot lose a rank: a failed or evicted pod restarts the whole gang (within max_retry),
# which is also why pods default to restartPolicy Never (a kubelet restart of one pod would
# leave the others hanging at the rendezvous, and Volcano would never see the failure).
DEFAULT_JOB_POLICIES = [
    {"event": "PodEvicted", "action": "RestartJob"},
    {"event": "PodFailed", "action": "RestartJob"},
]
DEFAULT_RESTART_POLICY = "Never"
DEFAULT_MAX_RETRY = 3

EVENTS = {"*", "PodFailed", "PodEvicted", "PodPending", "PodRunning", "Unknown", "TaskCompleted", "TaskFailed",
          "JobUpdated"}
ACTIONS = {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "TerminateJob", "CompleteJob", "ResumeJob"}
PLUGINS = {"pytorch", "svc", "env", "ssh", "mpi", "tensorflow", "ray", "hcclrank"}
RESTART_POLICIES = {"Always", "OnFailure", "Never"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TASK_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
RESOURCE_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


class JobSpecError(ValueError):
    """A bad argument or template, found before anything is submitted."""


@dataclass(frozen=True)
class TrainingScript:
    filename: str
    content: str


@dataclass
class PyTorchJobRequest:
    """Operator arguments; None means "not given"."""

    name: str | None = None
    namespace: str | None = None
    image: str | None = None
    command: list[str] | None = None
    args: list[str] | None = None
    env: list[dict] | dict[str, Any] | None = None
    worker_replicas: int | str | None = None
    master_task_name: str | None = None
    worker_task_name: str | None = None
    port: int | str | None = None
    resources: dict | None = None
    master_resources: dict | None = None
    worker_resources: dict | None = None
    node_selector: dict[str, str] | None = None
    tolerations: list[dict] | None = None
    volumes: list[dict] | None = None
    volume_mounts: list[dict] | None = None
    service_account_name: str | None = None
    image_pull_policy: str | None = None
    image_pull_secrets: list[str] | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    priority_class_name: str | None = None
    queue: str | None = None
    scheduler_name: str | None = None
    min_available: int | str | None = None
    max_retry: int | str | None = None
    ttl_seconds_after_finished: int | str | None = None
    policies: list[dict] | None = None
    master_policies: list[dict] | None = None
    restart_policy: str | None = None
    extra_plugins: dict[str, list[str]] | None = None
    training_script: TrainingScript | None = None
    job_template: dict | None = None
    full_job_spec: dict | None = None


@dataclass
class JobManifests:
    job: dict
    configmap: dict | None

    def to_yaml(self) -> str:
        documents = [doc for doc in (self.configmap, self.job) if doc is not None]
        return yaml.safe_dump_all(documents, sort_keys=False, allow_unicode=True)


# -- names and labels -------------------------------------------------------------------------------


def _short_hash(value: str, length: int = 6) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:length]


def sanitize_label_value(value: str) -> str:
    """A valid label value; long or rewritten values keep a hash so distinct inputs stay distinct."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(value))
    if cleaned == value and len(cleaned) <= 63 and LABEL_VALUE.match(cleaned):
        return cleaned
    cleaned = cleaned.strip("._-")[: 63 - 7].strip("._-")
    return f"{cleaned}-{_short_hash(str(value))}" if cleaned else _short_hash(str(value))


def sanitize_dns_label(value: str, max_len: int) -> str:
    cleaned = re.sub(r"[^a-z0-9-]", "", re.sub(r"[_.\s]", "-", value.lower()))
    cleaned = re.sub(r"-+", "-", cleaned).strip("-")
    if not cleaned or not cleaned[0].isalpha():
        cleaned = f"j-{cleaned}".rstrip("-")
    return cleaned[:max_len].rstrip("-")


def max_job_name_length(task_names: list[str], max_index: int) -> int:
    """Longest Job name for which every pod name `<job>-<task>-<index>` is a valid hostname."""
    longest = max((len(name) for name in task_names), default=0)
    return POD_NAME_MAX - longest - len(str(max(0, max_index))) - 2


def default_job_name(dag_id: str, task_id: str, *, suffix: str, max_len: int) -> str:
    base = sanitize_dns_label(f"{dag_id}-{task_id}", max(1, max_len - len(suffix) - 1))
    return f"{base}-{suffix}"


def run_labels(*, dag_id: str, task_id: str, run_id: str, try_number: int, map_index: int) -> dict[str, str]:
    return {
        MANAGED_BY_LABEL: MANAGED_BY_VALUE,
        f"{LABEL_PREFIX}dag-id": sanitize_label_value(dag_id),
        f"{LABEL_PREFIX}task-id": sanitize_label_value(task_id),
        f"{LABEL_PREFIX}run-id": sanitize_label_value(run_id),
        f"{LABEL_PREFIX}map-index": str(map_index) if map_index >= 0 else "none",  # "-1" is no label value
        TRY_NUMBER_LABEL: str(try_number),
    }


def identity_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The labels that find this task instance's Job across its tries."""
    return {key: value for key, value in labels.items()
            if key.startswith(LABEL_PREFIX) and key not in (TRY_NUMBER_LABEL, CHECKED_LABEL)}


def script_configmap_name(job_name: str) -> str:
    return f"{job_name}-script"


# -- coercion of templated values --------------------------------------------------------------------


def _integer(parameter: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    """Airflow templating renders numbers as strings: accept "2", reject "two", 1.5, True, -1."""
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
            maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise JobSpecError(f"{parameter} must be an integer {bound}, got {value!r}")
    return value


def load_job_template(text: str, *, source: str) -> dict:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise JobSpecError(f"job_template {source} is not valid YAML/JSON{where}: {problem}") from error
    if not isinstance(loaded, dict):
        raise JobSpecError(f"job_template {source} must be a mapping (a Volcano Job), got {type(loaded).__name__}")
    if loaded.get("apiVersion") != API_VERSION or loaded.get("kind") != "Job":
        raise JobSpecError(f"job_template {source} must be apiVersion {API_VERSION}, kind Job; got "
                           f"apiVersion {loaded.get('apiVersion')!r}, kind {loaded.get('kind')!r}")
    return loaded


def _env_list(env: list[dict] | dict[str, Any]) -> list[dict]:
    items = [{"name": str(k), "value": str(v)} for k, v in env.items()] if isinstance(env, dict) else list(env)
    for item in items:
        if not isinstance(item, dict) or not ENV_NAME.match(str(item.get("name", ""))):
            raise JobSpecError(f"env: invalid environment variable {item!r}")
    return copy.deepcopy(items)


def _resources(parameter: str, spec: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """{"cpu","memory","gpu",...} shorthand (requests = limits) or {"requests","limits"}."""
    if not spec:
        return {}
    if not isinstance(spec, Mapping):
        raise JobSpecError(f"{parameter} must be a mapping, got {spec!r}")
    if set(spec) <= {"requests", "limits"}:
        parts = {key: _quantities(f"{parameter}.{key}", value) for key, value in spec.items()}
    else:
        quantities = _quantities(parameter, spec)
        parts = {"requests": dict(quantities), "limits": dict(quantities)}
    return {key: value for key, value in parts.items() if value}


def _quantities(parameter: str, spec: Any) -> dict[str, str]:
    if not isinstance(spec, Mapping):
        raise JobSpecError(f"{parameter} must be a mapping of resource name to quantity, got {spec!r}")
    out = {}
    for key, value in spec.items():
        name = "nvidia.com/gpu" if key == "gpu" else str(key)
        if not RESOURCE_NAME.match(name) or value is None or str(value).strip() == "":
            raise JobSpecError(f"{parameter}: invalid resource {key!r}: {value!r}")
        out[name] = str(value)
    return out


def _merge_resources(shared: dict, role: dict) -> dict:
    merged = {key: dict(value) for key, value in shared.items()}
    for key, value in role.items():
        merged.setdefault(key, {}).update(value)
    return merged


# -- building ----------------------------------------------------------------------------------------


def build_manifests(req: PyTorchJobRequest, *, run_labels: dict[str, str], default_name: str) -> JobManifests:
    if req.job_template is not None and req.full_job_spec is not None:
        raise JobSpecError("job_template and full_job_spec cannot be combined: give one of them")
    if req.full_job_spec is not None:
        allowed = {"name", "namespace", "labels", "annotations", "full_job_spec", "training_script"}
        conflicting = [f.name for f in fields(req) if f.name not in allowed and getattr(req, f.name) is not None]
        if conflicting:
            raise JobSpecError(f"full_job_spec is used as is: {', '.join(conflicting)} cannot be combined with it")
        job = copy.deepcopy(req.full_job_spec)
    elif req.job_template is not None:
        job = copy.deepcopy(req.job_template)
    else:
        job = _default_job(req)

    master = req.master_task_name or _plugin_arg(job, "master") or DEFAULT_MASTER
    worker = req.worker_task_name or _plugin_arg(job, "worker") or DEFAULT_WORKER
    metadata = job.setdefault("metadata", {})
    if req.name is not None:
        metadata["name"] = req.name
    metadata.setdefault("name", default_name)
    if req.namespace:
        metadata["namespace"] = req.namespace
    if req.full_job_spec is None:
        _apply_arguments(job, req, master, worker)
    _apply_labels(job, req, run_labels)
    configmap = _apply_script(job, req, master, worker, run_labels) if req.training_script else None
    validate_job(job)
    return JobManifests(job=job, configmap=configmap)


def _default_job(req: PyTorchJobRequest) -> dict:
    master = req.master_task_name or DEFAULT_MASTER
    worker = req.worker_task_name or DEFAULT_WORKER
    workers = _integer("worker_replicas", req.worker_replicas if req.worker_replicas is not None else 1)

    def task(name: str, replicas: int, policies: list[dict] | None) -> dict:
        spec: dict[str, Any] = {"name": name, "replicas": replicas, "template": {
            "spec": {"containers": [{"name": name}], "restartPolicy": DEFAULT_RESTART_POLICY}}}
        if policies:
            spec["policies"] = copy.deepcopy(policies)
        return spec

    tasks = [task(master, 1, req.master_policies if req.master_policies is not None else DEFAULT_MASTER_POLICIES)]
    if workers:
        tasks.append(task(worker, workers, None))
    return {
        "apiVersion": API_VERSION,
        "kind": "Job",
        "metadata": {},
        "spec": {
            "schedulerName": "volcano",
            "queue": "default",
            "minAvailable": 1 + workers,
            "maxRetry": DEFAULT_MAX_RETRY,
            "plugins": {"pytorch": [f"--master={master}", f"--worker={worker}", f"--port={DEFAULT_PORT}"], "svc": []},
            "policies": copy.deepcopy(DEFAULT_JOB_POLICIES),
            "tasks": tasks,
        },
    }


def _plugin_arg(job: dict, flag: str) -> str | None:
    for arg in ((job.get("spec") or {}).get("plugins") or {}).get("pytorch") or []:
        if str(arg).startswith(f"--{flag}="):
            return str(arg).split("=", 1)[1]
    return None


def _find_task(job: dict, name: str) -> dict | None:
    return next((task for task in (job.get("spec") or {}).get("tasks") or [] if task.get("name") == name), None)


def _apply_arguments(job: dict, req: PyTorchJobRequest, master: str, worker: str) -> None:
    spec = job.setdefault("spec", {})
    scalar = {"queue": req.queue, "schedulerName": req.scheduler_name, "priorityClassName": req.priority_class_name}
    for key, value in scalar.items():
        if value is not None:
            spec[key] = value
    if req.max_retry is not None:
        # Volcano's webhook reads maxRetry 0 as "unset" and makes it 3: refuse it rather than surprise.
        spec["maxRetry"] = _integer("max_retry", req.max_retry, minimum=1)
    if req.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = _integer("ttl_seconds_after_finished", req.ttl_seconds_after_finished)
    if req.policies is not None:
        spec["policies"] = copy.deepcopy(req.policies)
    if req.extra_plugins:
        for plugin, plugin_args in req.extra_plugins.items():
            spec.setdefault("plugins", {})[plugin] = list(plugin_args)
    if req.master_task_name or req.worker_task_name or req.port is not None:
        port = _integer("port", req.port, 1, 65535) if req.port is not None else int(
            _plugin_arg(job, "port") or DEFAULT_PORT)
        spec.setdefault("plugins", {})["pytorch"] = [f"--master={master}", f"--worker={worker}", f"--port={port}"]
    master_task, worker_task = _find_task(job, master), _find_task(job, worker)
    if req.worker_replicas is not None:
        workers = _integer("worker_replicas", req.worker_replicas)
        if worker_task is None and workers:
            raise JobSpecError(f"worker_replicas: the job has no task named {worker!r} (worker_task_name)")
        if worker_task is not None:
            worker_task["replicas"] = workers
            if workers == 0:
                spec["tasks"].remove(worker_task)
                worker_task = None
    if req.master_policies is not None and master_task is not None:
        master_task["policies"] = copy.deepcopy(req.master_policies)
    shared = _resources("resources", req.resources)
    roles = [(master_task, _merge_resources(shared, _resources("master_resources", req.master_resources))),
             (worker_task, _merge_resources(shared, _resources("worker_resources", req.worker_resources)))]
    for task, resources in roles:
        if task is not None:
            _apply_pod_arguments(task, req, resources)
    if req.min_available is not None:
        spec["minAvailable"] = _integer("min_available", req.min_available)
    elif req.job_template is None:
        spec["minAvailable"] = sum(int(task.get("replicas", 0)) for task in spec.get("tasks") or [])


def _apply_pod_arguments(task: dict, req: PyTorchJobRequest, resources: dict) -> None:
    pod = task.setdefault("template", {}).setdefault("spec", {})
    containers = pod.setdefault("containers", [{"name": task.get("name", "main")}])
    container = containers[0]
    if req.image is not None:
        container["image"] = req.image
    if req.image_pull_policy is not None:
        if req.image_pull_policy not in PULL_POLICIES:
            raise JobSpecError(
                f"image_pull_policy must be one of {sorted(PULL_POLICIES)}, got {req.image_pull_policy!r}"
            )
        container["imagePullPolicy"] = req.image_pull_policy
    if req.command is not None:
        container["command"] = [str(part) for part in req.command]
    if req.args is not None:
        container["args"] = [str(part) for part in req.args]
    if req.env is not None:
        container["env"] = _env_list(req.env)
    if resources:
        container["resources"] = resources
    if req.volume_mounts is not None:
        container["volumeMounts"] = copy.deepcopy(req.volume_mounts)
    if req.restart_policy is not None:
        if req.restart_policy not in RESTART_POLICIES:
            raise JobSpecError(f"restart_policy must be one of {sorted(RESTART_POLICIES)}, got {req.restart_policy!r}")
        pod["restartPolicy"] = req.restart_policy
    optional = {"nodeSelector": req.node_selector, "tolerations": req.tolerations, "volumes": req.volumes,
                "serviceAccountName": req.service_account_name, "priorityClassName": req.priority_class_name}
    for key, value in optional.items():
        if value is not None:
            pod[key] = copy.deepcopy(value)
    if req.image_pull_secrets is not None:
        pod["imagePullSecrets"] = [{"name": str(secret)} for secret in req.image_pull_secrets]


def _apply_labels(job: dict, req: PyTorchJobRequest, labels: dict[str, str]) -> None:
    user_labels = req.labels or {}
    for key, value in user_labels.items():
        _check_label("labels", str(key), str(value))
    metadata = job["metadata"]
    metadata["labels"] = {**(metadata.get("labels") or {}), **{k: str(v) for k, v in user_labels.items()}, **labels}
    if req.annotations:
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **req.annotations}
    for task in (job.get("spec") or {}).get("tasks") or []:
        template_meta = task.setdefault("template", {}).setdefault("metadata", {})
        template_meta["labels"] = {**(template_meta.get("labels") or {}), **user_labels, **labels}
        if req.annotations:
            template_meta["annotations"] = {**(template_meta.get("annotations") or {}), **req.annotations}


def _check_label(parameter: str, key: str, value: str) -> None:
    prefix, _, name = key.rpartition("/")
    if (prefix and len(prefix) > 253) or not LABEL_KEY_NAME.match(name) or len(name) > 63:
        raise JobSpecError(f"{parameter}: invalid label key {key!r}")
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise JobSpecError(f"{parameter}: invalid label value {value!r} for key {key!r}")


def _apply_script(job: dict, req: PyTorchJobRequest, master: str, worker: str, labels: dict[str, str]) -> dict:
    script = req.training_script
    assert script is not None
    if len(script.content.encode()) > MAX_CONFIGMAP_BYTES:
        raise JobSpecError(f"training_script {script.filename!r} is {len(script.content.encode())} bytes; a "
                           f"ConfigMap holds at most {MAX_CONFIGMAP_BYTES}: bake it into the image instead")
    name = script_configmap_name(job["metadata"]["name"])
    for task_name in (master, worker):
        task = _find_task(job, task_name)
        if task is None:
            continue
        pod = task.setdefault("template", {}).setdefault("spec", {})
        volumes = pod.setdefault("volumes", [])
        if not any(volume.get("name") == SCRIPT_VOLUME for volume in volumes):
            volumes.append({"name": SCRIPT_VOLUME, "configMap": {"name": name}})
        container = pod.setdefault("containers", [{"name": task_name}])[0]
        mounts = container.setdefault("volumeMounts", [])
        if not any(mount.get("name") == SCRIPT_VOLUME for mount in mounts):
            mounts.append({"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT_PATH, "readOnly": True})
        if req.command is None:
            container["command"] = ["python", f"{SCRIPT_MOUNT_PATH}/{script.filename}"]
        env = container.setdefault("env", [])
        if not any(item.get("name") == "PYTHONUNBUFFERED" for item in env):
            env.append({"name": "PYTHONUNBUFFERED", "value": "1"})  # so the log streams as it is written
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if job["metadata"].get("namespace"):
        metadata["namespace"] = job["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {script.filename: script.content}}


# -- validation --------------------------------------------------------------------------------------


def validate_job(job: dict) -> None:
    """What Volcano's admission webhook would reject, and what would break PyTorch ranks."""
    if job.get("apiVersion") != API_VERSION or job.get("kind") != "Job":
        raise JobSpecError(f"job: must be apiVersion {API_VERSION}, kind Job")
    spec = job.get("spec") or {}
    tasks = spec.get("tasks") or []
    if not tasks:
        raise JobSpecError("job_template: spec.tasks must list at least one task")
    names: list[str] = []
    total = 0
    for index, task in enumerate(tasks):
        name = task.get("name")
        if not isinstance(name, str) or not TASK_NAME.match(name) or len(name) > 63:
            raise JobSpecError(f"task name {name!r} (spec.tasks[{index}].name) is not a DNS label")
        if name in names:
            raise JobSpecError(f"duplicate task name {name!r} (spec.tasks[{names.index(name)}] and "
                               f"spec.tasks[{index}]): master_task_name/worker_task_name must differ")
        names.append(name)
        replicas = _integer(f"spec.tasks[{index}].replicas ({name})", task.get("replicas", 0))
        total += replicas
        if task.get("minAvailable") is not None and _integer(
                f"spec.tasks[{index}].minAvailable", task["minAvailable"]) > replicas:
            raise JobSpecError(f"spec.tasks[{index}].minAvailable ({task['minAvailable']}) is larger than its "
                               f"replicas ({replicas})")
        _validate_policies(f"spec.tasks[{index}].policies ({name})", task.get("policies"))
        _validate_pod(name, (task.get("template") or {}).get("spec") or {})
    _validate_policies("policies", spec.get("policies"))
    _validate_plugins(spec, tasks)
    if spec.get("minAvailable") is not None:
        min_available = _integer("min_available", spec["minAvailable"])
        if min_available > total:
            raise JobSpecError(f"min_available ({min_available}) is larger than the total replicas ({total})")
    for key, parameter in (("maxRetry", "max_retry"), ("ttlSecondsAfterFinished", "ttl_seconds_after_finished")):
        if spec.get(key) is not None:
            _integer(parameter, spec[key])
    for key, parameter in (("queue", "queue"), ("schedulerName", "scheduler_name")):
        if key in spec and (not isinstance(spec[key], str) or not spec[key]):
            raise JobSpecError(f"{parameter} must be a non-empty string, got {spec[key]!r}")
    name = (job.get("metadata") or {}).get("name", "")
    longest = max_job_name_length(names, max(int(task.get("replicas", 1)) - 1 for task in tasks))
    if not isinstance(name, str) or not DNS_LABEL.match(name):
        raise JobSpecError(f"name {name!r} is not a DNS label (lowercase letters, digits and '-', "
                           "starting with a letter)")
    if len(name) > longest:
        raise JobSpecError(f"name {name!r} is {len(name)} characters; at most {longest} keep every pod name "
                           f"<job>-<task>-<index> within {POD_NAME_MAX} characters")
    for key, value in ((job.get("metadata") or {}).get("labels") or {}).items():
        _check_label("labels", key, str(value))


def _validate_pod(task: str, pod: dict) -> None:
    containers = pod.get("containers") or []
    if not containers:
        raise JobSpecError(f"task {task!r} has no containers")
    for container in containers:
        if not container.get("image"):
            raise JobSpecError(f"image: task {task!r} container {container.get('name')!r} has no image")
    if pod.get("restartPolicy") is not None and pod["restartPolicy"] not in RESTART_POLICIES:
        raise JobSpecError(f"restart_policy must be one of {sorted(RESTART_POLICIES)}, got {pod['restartPolicy']!r}")


def _validate_policies(parameter: str, policies: Any) -> None:
    if policies is None:
        return
    if not isinstance(policies, list):
        raise JobSpecError(f"{parameter} must be a list of policies, got {policies!r}")
    seen: set[str] = set()
    for policy in policies:
        if not isinstance(policy, dict):
            raise JobSpecError(f"{parameter}: a policy must be a mapping, got {policy!r}")
        events = ([policy["event"]] if policy.get("event") else []) + list(policy.get("events") or [])
        exit_code = policy.get("exitCode")
        if events and exit_code is not None:
            raise JobSpecError(f"{parameter}: policy {policy!r} has both an event and exitCode; give one")
        if not events and exit_code is None:
            raise JobSpecError(f"{parameter}: policy {policy!r} needs an event or an exitCode")
        if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int) or exit_code == 0):
            raise JobSpecError(f"{parameter}: exitCode must be a non-zero integer, got {exit_code!r}")
        for event in events:
            if event not in EVENTS:
                raise JobSpecError(f"{parameter}: unknown event {event!r} (one of {', '.join(sorted(EVENTS))})")
            if event in seen:
                raise JobSpecError(f"{parameter}: event {event!r} appears in more than one policy")
            seen.add(event)
        if policy.get("action") not in ACTIONS:
            raise JobSpecError(f"{parameter}: unknown action {policy.get('action')!r} "
                               f"(one of {', '.join(sorted(ACTIONS))})")


def _validate_plugins(spec: dict, tasks: list[dict]) -> None:
    plugins = spec.get("plugins") or {}
    for plugin in plugins:
        if plugin not in PLUGINS:
            raise JobSpecError(
                f"extra_plugins: unknown Volcano plugin {plugin!r} (one of {', '.join(sorted(PLUGINS))})"
            )
    if "pytorch" not in plugins:
        return
    master = _plugin_arg({"spec": spec}, "master") or DEFAULT_MASTER
    worker = _plugin_arg({"spec": spec}, "worker") or DEFAULT_WORKER
    port = _plugin_arg({"spec": spec}, "port")
    if port is not None:
        _integer("port", port, 1, 65535)
    by_name = {task["name"]: task for task in tasks}
    if master not in by_name:
        raise JobSpecError(f"master_task_name {master!r}: the job has no such task (tasks: {', '.join(by_name)})")
    master_replicas = int(by_name[master].get("replicas", 0))
    if master_replicas != 1:
        raise JobSpecError(f"the master task {master!r} must have exactly 1 replica, got {master_replicas}: "
                           "Volcano's pytorch plugin gives rank 0 to master-0 and breaks ranks otherwise")
    if worker not in by_name and len(tasks) > 1:
        raise JobSpecError(f"worker_task_name {worker!r}: the job has no such task (tasks: {', '.join(by_name)})")

