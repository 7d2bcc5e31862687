"""Building the Job (and the training script's ConfigMap) from a checked request: a template or the
built-in master/worker skeleton, with the arguments applied, the provider's labels, the script shipped
and mounted, TensorBoard, wait-for-master and debug mode added, then the whole Job validated."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from airflow_volcano import hostfile_launch
from airflow_volcano.constants import DEBUG_ANNOTATION, DEFAULT_SHM_SIZE, JOB_API_VERSION, SCRIPT_MOUNT_PATH
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.kubelet import container_string
from airflow_volcano.manifest.checks import (
    check_template_keys,
    merge_resources,
    requests_within_limits,
    resource_requirements,
    seconds,
    validate_job,
)
from airflow_volcano.manifest.launchers import (
    DEBUG_POD_MARGIN_SECONDS,
    apply_debug,
    apply_wait_for_master,
    hostfile_launch_data,
    torchrun_command,
)
from airflow_volcano.manifest.names import (
    DEFAULT_MASTER,
    DEFAULT_WORKER,
    TENSORBOARD_TASK,
    find_task,
    fit_default_name,
    plugin_arg,
    pod_name,
    role_names,
    script_configmap_name,
)
from airflow_volcano.manifest.pod_runtime import apply_pod_runtime, shared_volume
from airflow_volcano.manifest.policies import DEFAULT_MASTER_POLICIES, DEFAULT_RETRYABLE_EXIT_CODES, exit_code_policies
from airflow_volcano.manifest.request import (
    TENSORBOARD_PORT,
    JobKind,
    JobRequest,
    Lands,
    TrainingScript,
    arguments,
    landings,
    normalize,
)
from airflow_volcano.manifest.retry_budget import DEFAULT_MAX_PREEMPTIONS, VOLCANO_DEFAULT_MAX_RETRY, apply_retry_budget

# The built-in skeleton's defaults (Volcano's own, and those of Volcano's PyTorch example Job).
DEFAULT_PORT = 23456  # the pytorch plugin's MASTER_PORT
DEFAULT_QUEUE, DEFAULT_SCHEDULER = "default", "volcano"

SCRIPT_VOLUME = "training-script"
DEFAULT_RESTART_POLICY = "Never"


@dataclass
class JobManifests:
    """What a task submits: the Job, the training script's ConfigMap, and the Job's main task."""

    job: dict
    configmap: dict | None  # the training-script ConfigMap
    main_task: str = DEFAULT_MASTER  # whose pod 0 is the Job's main pod (log, result, TensorBoard volume)
    request_hash: str = ""  # what the user asked for (see request_hash): a retry reattaches only to its own

    def documents(self) -> list[dict]:
        """What to apply, in order: the ConfigMap first (it must exist before the pods that mount it)."""
        return [doc for doc in (self.configmap, self.job) if doc is not None]


def build_manifests(req: JobRequest, *, run_labels: dict[str, str], default_name: str,
                    checkpoint_subdir: str = "manual") -> JobManifests:
    """The Job (and ConfigMap) to submit; raises JobSpecError naming the bad parameter.
    `checkpoint_subdir` is the task instance's directory under `checkpoint_dir` (names.checkpoint_subdir)."""
    if req.job_template is not None and req.full_job_spec is not None:
        raise JobSpecError("job_template and full_job_spec cannot be combined: give one of them")
    if req.kind is JobKind.GENERIC and req.job_template is None and req.full_job_spec is None:
        raise JobSpecError("job_template or full_job_spec is required: VolcanoJobOperator runs the Job you describe "
                           "(VolcanoPyTorchJobOperator builds one from arguments)")
    asked = request_hash(req)
    req = normalize(req)
    if req.full_job_spec is not None:
        allowed = {"name", "namespace", "labels", "annotations", "full_job_spec", "main_task",
                   "debug_timeout"}  # (debug itself is refused: it changes the commands)
        conflicting = [name for name in arguments() if name not in allowed and getattr(req, name) is not None
                       and not (name == "shm_size" and req.shm_size == DEFAULT_SHM_SIZE)]
        if conflicting:
            raise JobSpecError(f"full_job_spec is used as is: {', '.join(conflicting)} cannot be combined with it "
                               "(use job_template to override fields)")
        job, origin = copy.deepcopy(req.full_job_spec), "full_job_spec"
        check_template_keys(job, origin)
    elif req.job_template is not None:
        job, origin = copy.deepcopy(req.job_template), "job_template"
        check_template_keys(job, origin)
        _apply_arguments(job, req)
    else:
        job, origin = _default_job(req), "job"
        _apply_arguments(job, req)

    metadata = job.setdefault("metadata", {})
    if req.name is not None:
        metadata["name"] = req.name
    elif not metadata.get("name"):
        metadata["name"] = fit_default_name(default_name, job)
    if req.namespace:
        metadata["namespace"] = req.namespace
    if req.wait_for_master:
        apply_wait_for_master(job, req)
    if req.tensorboard is not None:
        _add_tensorboard(job, req)
    _apply_labels(job, req, run_labels)
    configmap = _apply_script(job, req, run_labels) if req.training_script else None
    if req.debug:
        # A hostfile launch's workers run only sshd, which the master's launcher needs when run by hand.
        apply_debug(job, keep={role_names(job, req)[1]} if req.kind is JobKind.HOSTFILE else set(),
                     seconds=math.ceil(seconds("debug_timeout", req.debug_timeout) + DEBUG_POD_MARGIN_SECONDS))
    if req.full_job_spec is None:
        apply_pod_runtime(job, pod_tasks(job, req), req, checkpoint_subdir=checkpoint_subdir)
    validate_job(job, origin=origin, parameters={lands.key: name for name, lands in landings("job")})
    if req.full_job_spec is None:
        apply_retry_budget(job, DEFAULT_MAX_PREEMPTIONS if req.max_preemptions is None else int(req.max_preemptions))
    main = main_task(job, req)
    names = [task.get("name") for task in job["spec"]["tasks"]]
    if main not in names:
        parameter = "main_task" if req.kind is JobKind.GENERIC else "master_task_name"
        raise JobSpecError(f"{parameter} {main!r}: the job has no such task (tasks: {', '.join(map(str, names))})")
    return JobManifests(job=job, configmap=configmap, main_task=main, request_hash=asked)


# The scheme of request_hash's values; a Job annotated by an earlier scheme cannot be compared.
REQUEST_HASH_SCHEME = "v2:"


def _canonical(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    return f"{type(value).__name__}:{value}"


def request_hash(req: JobRequest) -> str:
    """What the user asked for, as a hash: the kind of Job and every argument given (its value, when it
    is not the argument's default), the script and the template as rendered, debug mode; not what the
    provider builds around them (its shell, what the cluster's Volcano release needs), so a retry run by
    an upgraded provider still reattaches to the Job an earlier try submitted. The same for every try of
    a task instance given the same arguments (a default name's random suffix and the try number are not
    arguments). A try reattaches only to a Job of its own request."""
    asked = {"kind": str(req.kind)}
    for item in dataclasses.fields(req):
        value = getattr(req, item.name)
        if item.name == "kind" or item.metadata.get("derived") or value is None or value == item.default:
            continue
        asked[item.name] = value
    text = json.dumps(asked, sort_keys=True, default=_canonical)
    return REQUEST_HASH_SCHEME + hashlib.sha256(text.encode()).hexdigest()[:16]


def is_debug_job(job: dict) -> bool:
    """Whether a Job's pods were built for debug mode (they sleep: nothing trains in them)."""
    return any(DEBUG_ANNOTATION in (((task.get("template") or {}).get("metadata") or {}).get("annotations") or {})
               for task in (job.get("spec") or {}).get("tasks") or [] if isinstance(task, dict))


def main_task(job: dict, req: JobRequest) -> str:
    """The task whose pod 0 is the Job's main pod: the PyTorch master, or for any Job `main_task`,
    else the pytorch plugin's master if the Job has one, else its first task."""
    if req.main_task:
        return req.main_task
    if req.kind is not JobKind.GENERIC:
        return role_names(job, req)[0]
    names = [str(task.get("name")) for task in job["spec"]["tasks"]]
    master = plugin_arg(job, "master")
    return master if master is not None and master in names else names[0]


def pod_tasks(job: dict, req: JobRequest) -> list[dict]:
    """The tasks pod arguments and the script go to: every task for any Job, else master and workers."""
    if req.kind is JobKind.GENERIC:
        return [task for task in job["spec"].get("tasks") or [] if isinstance(task, dict)]
    return [task for name in role_names(job, req) if (task := find_task(job, name)) is not None]


def _default_job(req: JobRequest) -> dict:
    """The skeleton the arguments are applied to: defaults only where nothing was given."""
    master = req.master_task_name or DEFAULT_MASTER
    worker = req.worker_task_name or DEFAULT_WORKER

    def task(name: str, replicas: int) -> dict:
        return {"name": name, "replicas": replicas, "template": {
            "spec": {"containers": [{"name": name}], "restartPolicy": DEFAULT_RESTART_POLICY}}}

    tasks = [task(master, 1)]
    tasks[0]["policies"] = copy.deepcopy(DEFAULT_MASTER_POLICIES)
    workers = int(req.worker_replicas) if req.worker_replicas is not None else 1  # checked: an int
    if workers:
        tasks.append(task(worker, workers))
    # svc listed explicitly: MASTER_ADDR and the host files need it and only the webhook would add it otherwise.
    plugins: dict[str, list[str]] = {"pytorch": [f"--master={master}", f"--worker={worker}", f"--port={DEFAULT_PORT}"],
                                     "svc": []}
    if req.kind is JobKind.HOSTFILE:
        plugins = {plugin: [] for plugin in hostfile_launch.REQUIRED_PLUGINS}
    return {
        "apiVersion": JOB_API_VERSION,
        "kind": "Job",
        "metadata": {},
        "spec": {
            "schedulerName": DEFAULT_SCHEDULER,
            "queue": DEFAULT_QUEUE,
            "minAvailable": 1 + workers,  # gang: DDP cannot start until every rank is up
            "maxRetry": VOLCANO_DEFAULT_MAX_RETRY,
            "plugins": plugins,
            "policies": exit_code_policies(DEFAULT_RETRYABLE_EXIT_CODES, "job"),
            "tasks": tasks,
        },
    }


def _set(target: dict, key: str, value: Any) -> None:
    """Set an explicitly given value; an empty one removes the key (no nulls or empty lists)."""
    if value is None:
        return
    if value in ([], {}, ""):
        target.pop(key, None)
    else:
        target[key] = copy.deepcopy(value)


def _landed(req: JobRequest, name: str, lands: Lands) -> Any:
    """An argument's value as its field in the Job takes it (None: not given)."""
    value = getattr(req, name)
    if value is None or lands.convert is None or value in ([], {}, ""):
        return value
    return lands.convert(value)


def _apply_arguments(job: dict, req: JobRequest) -> None:
    spec = job.setdefault("spec", {})
    master, worker = role_names(job, req)
    for name, lands in landings("job"):
        _set(spec, lands.key, _landed(req, name, lands))
    for plugin, plugin_args in (req.extra_plugins or {}).items():
        spec.setdefault("plugins", {})[plugin] = list(plugin_args)
    if req.kind is JobKind.HOSTFILE:
        for plugin in hostfile_launch.REQUIRED_PLUGINS:
            spec.setdefault("plugins", {}).setdefault(plugin, [])
    elif req.master_task_name or req.worker_task_name or req.port is not None or req.wait_for_master:
        _rewrite_pytorch_plugin(spec, master, worker, None if req.port is None else int(req.port))
    master_task, worker_task = find_task(job, master), find_task(job, worker)
    if req.worker_replicas is not None:
        worker_task = _set_worker_replicas(job, worker_task, worker, int(req.worker_replicas))
    if req.master_policies is not None and master_task is not None:
        _set(master_task, "policies", req.master_policies)
    shared = resource_requirements("container_resources", req.container_resources)
    if req.kind is JobKind.GENERIC:
        for task in pod_tasks(job, req):
            _apply_pod_arguments(task, req, shared)
    else:
        for role_task, role in ((master_task, "master_resources"), (worker_task, "worker_resources")):
            if role_task is not None:
                merged = merge_resources(shared, resource_requirements(role, getattr(req, role)))
                requests_within_limits(f"container_resources with {role}", merged)
                _apply_pod_arguments(role_task, req, merged)
    if req.min_available is not None:
        spec["minAvailable"] = req.min_available
    elif req.job_template is None:
        spec["minAvailable"] = sum(task.get("replicas", 0) for task in spec.get("tasks") or [])


def _rewrite_pytorch_plugin(spec: dict, master: str, worker: str, given: int | None) -> None:
    """Replace --master/--worker/--port, keep any other flag (e.g. --wait-master-enabled)."""
    plugins = spec.setdefault("plugins", {})
    current = [str(arg) for arg in plugins.get("pytorch") or []]
    port = given if given is not None else next(
        (arg.split("=", 1)[1] for arg in current if arg.startswith("--port=")), DEFAULT_PORT)
    others = [arg for arg in current if not arg.startswith(("--master=", "--worker=", "--port="))]
    plugins["pytorch"] = [f"--master={master}", f"--worker={worker}", f"--port={port}", *others]


def _set_worker_replicas(job: dict, worker_task: dict | None, worker: str, workers: int) -> dict | None:
    spec = job["spec"]
    if worker_task is None:
        if workers:
            raise JobSpecError(f"worker_replicas={workers}: the job has no task named {worker!r} "
                               "(set worker_task_name)")
        return None
    old = worker_task.get("replicas")
    total = sum(task.get("replicas", 0) for task in spec.get("tasks") or [] if isinstance(task.get("replicas"), int))
    if workers == 0:
        spec["tasks"].remove(worker_task)  # a 0-replica task would still be a task Volcano waits on
    else:
        worker_task["replicas"] = workers
        if worker_task.get("minAvailable") == old:
            worker_task["minAvailable"] = workers
    # A template that gang-scheduled every replica keeps doing so with the new count.
    if isinstance(old, int) and spec.get("minAvailable") == total:
        spec["minAvailable"] = total - old + workers
    return worker_task if workers else None


def _apply_pod_arguments(task: dict, req: JobRequest, resources: dict) -> None:
    pod = task.setdefault("template", {}).setdefault("spec", {})
    containers = pod.setdefault("containers", [])
    if not containers:
        containers.append({"name": task.get("name", "main")})
    container = containers[0]
    for name, lands in landings("container"):
        _set(container, lands.key, _landed(req, name, lands))
    _set(container, "resources", resources or None)
    for name, lands in landings("pod"):
        _set(pod, lands.key, _landed(req, name, lands))


def _apply_labels(job: dict, req: JobRequest, labels: dict[str, str]) -> None:
    user_labels = {str(key): str(value) for key, value in (req.labels or {}).items()}
    annotations = {str(key): str(value) for key, value in (req.annotations or {}).items()}
    targets = [job.setdefault("metadata", {})]
    for task in (job.get("spec") or {}).get("tasks") or []:
        if isinstance(task, dict):
            targets.append(task.setdefault("template", {}).setdefault("metadata", {}))
    for metadata in targets:
        metadata["labels"] = {**(metadata.get("labels") or {}), **user_labels, **labels}  # ours win
        if annotations:
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}


def _apply_script(job: dict, req: JobRequest, labels: dict[str, str]) -> dict:
    """Ship the script as a ConfigMap, mount it read-only into master and workers, run it."""
    script = req.training_script
    assert script is not None
    name = script_configmap_name(job["metadata"]["name"])
    data = {script.filename: script.content}
    worker_name = role_names(job, req)[1]
    if req.hostfile_launch is not None:  # a HOSTFILE Job's checked launch
        launch_scripts = hostfile_launch_data(job, req.hostfile_launch, worker_name)
        if script.filename in launch_scripts:
            raise JobSpecError(f"training_script: the file name {script.filename!r} is one of the operator's own "
                               "launch scripts; rename the script")
        data.update(launch_scripts)
    for task in pod_tasks(job, req):
        task_name = task.get("name", "main")
        pod = task.setdefault("template", {}).setdefault("spec", {})
        volumes = pod.setdefault("volumes", [])
        if not any(volume.get("name") == SCRIPT_VOLUME for volume in volumes):
            volumes.append({"name": SCRIPT_VOLUME, "configMap": {"name": name}})
        containers = pod.setdefault("containers", [])
        if not containers:
            containers.append({"name": task_name})
        container = containers[0]
        mounts = container.setdefault("volumeMounts", [])
        if not any(mount.get("name") == SCRIPT_VOLUME for mount in mounts):
            mounts.append({"name": SCRIPT_VOLUME, "mountPath": SCRIPT_MOUNT_PATH, "readOnly": True})
        if req.command is None:
            container["command"] = _script_command(job, req, script, task_name, worker_name)
        if req.kind is JobKind.HOSTFILE and task_name != worker_name:
            # The ranks run on the workers, which keep the arguments (saved for them at start): the
            # master's launcher never carries them, so no launcher's command line or log shows them.
            container.pop("args", None)
        env = container.setdefault("env", [])
        if not any(item.get("name") == "PYTHONUNBUFFERED" for item in env):
            env.append({"name": "PYTHONUNBUFFERED", "value": "1"})  # so the log streams as it is written
        if req.hostfile_launch is not None:
            # The launch scripts take every value from their container's environment; ours win.
            ours = (hostfile_launch.worker_env(SCRIPT_MOUNT_PATH) if task_name == worker_name else
                    hostfile_launch.master_env(req.hostfile_launch, worker_name, SCRIPT_MOUNT_PATH))
            env[:] = [item for item in env if item.get("name") not in ours]
            env.extend({"name": key, "value": value} for key, value in ours.items())
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if job["metadata"].get("namespace"):
        metadata["namespace"] = job["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _script_command(job: dict, req: JobRequest, script: TrainingScript, task: str, worker: str) -> list[str]:
    path = f"{SCRIPT_MOUNT_PATH}/{script.filename}"
    if req.hostfile_launch is not None:
        return (hostfile_launch.worker_command(SCRIPT_MOUNT_PATH) if task == worker else
                hostfile_launch.master_command(req.hostfile_launch, path, SCRIPT_MOUNT_PATH))
    if req.launcher == "torchrun":
        return torchrun_command(job, req, path, is_master=task == role_names(job, req)[0])
    return ["python", path]


def _add_tensorboard(job: dict, req: JobRequest) -> None:
    """A one-pod TensorBoard task reading the master's log volume, outside the gang and the ranks:
    the pytorch plugin counts only master and workers in WORLD_SIZE (Volcano >= 1.12)."""
    options = req.tensorboard or {}
    master_name = main_task(job, req)
    master = find_task(job, master_name)
    if master is None:
        raise JobSpecError(f"tensorboard: the job has no master task {master_name!r} whose volume to read")
    if find_task(job, TENSORBOARD_TASK) is not None:
        raise JobSpecError(f"tensorboard: the job already has a task named {TENSORBOARD_TASK!r}")
    pod = (master.get("template") or {}).get("spec") or {}
    container = (pod.get("containers") or [{}])[0]
    logdir = options["logdir"]
    mount, volume = shared_volume(pod, container, logdir, "tensorboard: logdir", "the master")
    port = options["port"]
    tensorboard_container: dict[str, Any] = {
        "name": TENSORBOARD_TASK,
        "image": options.get("image") or container.get("image"),
        "command": ["python", "-m", "tensorboard.main", container_string(f"--logdir={logdir}"), "--bind_all",
                    f"--port={port}"],
        "ports": [{"name": TENSORBOARD_TASK, "containerPort": port}],
        "volumeMounts": [{**copy.deepcopy(mount), "readOnly": True}],
    }
    if container.get("imagePullPolicy"):
        tensorboard_container["imagePullPolicy"] = container["imagePullPolicy"]
    if options.get("resources"):
        tensorboard_container["resources"] = options["resources"]
    tensorboard_pod: dict[str, Any] = {"containers": [tensorboard_container], "volumes": [copy.deepcopy(volume)],
                                       "restartPolicy": "OnFailure"}  # the kubelet restarts it in place
    for key in ("nodeSelector", "tolerations", "affinity", "imagePullSecrets", "serviceAccountName",
                "priorityClassName"):
        if pod.get(key):
            tensorboard_pod[key] = copy.deepcopy(pod[key])
    job["spec"]["tasks"].append({
        "name": TENSORBOARD_TASK, "replicas": 1,
        "minAvailable": 0,  # not part of the gang: training never waits for TensorBoard
        # Task policies win over the Job's: a lost TensorBoard pod restarts alone, never the gang.
        "policies": [{"events": ["PodEvicted", "PodFailed"], "action": "RestartTask"}],
        "template": {"spec": tensorboard_pod},
    })
    # TensorBoard never exits, so the Job can only end when the master's completion ends it.
    policies = master.setdefault("policies", [])
    if not any(policy.get("action") == "CompleteJob" for policy in policies):
        policies.append({"event": "TaskCompleted", "action": "CompleteJob"})


def tensorboard_endpoint(job: dict) -> tuple[str, int] | None:
    """The TensorBoard pod's name and port, if the Job has the task `tensorboard=` adds."""
    task = find_task(job, TENSORBOARD_TASK)
    if task is None:
        return None
    containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    ports = [port.get("containerPort") for port in containers[0].get("ports") or []
             if port.get("name") == TENSORBOARD_TASK]
    return pod_name(job["metadata"]["name"], TENSORBOARD_TASK), int(ports[0] if ports else TENSORBOARD_PORT)


def task_pods(job: dict, task_names: list[str], parameter: str) -> list[tuple[str, str | None]]:
    """Every pod of the named tasks, with its first container: `<job>-<task>-<index>`, as
    Volcano names them. A name the Job has no task for is an error naming `parameter`."""
    tasks = {task.get("name"): task for task in (job.get("spec") or {}).get("tasks") or []}
    pods = []
    for name in task_names:
        if name not in tasks:
            raise JobSpecError(f"{parameter}: the job has no task {name!r} (tasks: {', '.join(map(str, tasks))})")
        task = tasks[name]
        containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or [{}]
        pods += [(pod_name(job["metadata"]["name"], name, index), containers[0].get("name"))
                 for index in range(int(task.get("replicas") or 0))]
    return pods
