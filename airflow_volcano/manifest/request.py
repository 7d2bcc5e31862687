"""The one request every operator builds from its arguments (`JobRequest`), and its checks.

An argument is declared once (`argument`), as a field of `JobRequest` named like the operator's
argument: its check (which validates, and for templated numbers converts, a given value), its
default, type, templating, where it lands in the Job and its doc text. The operators' signatures
and `:param` lines are generated from these declarations (operators/arguments.py). `normalize` runs
the checks and the rules that relate arguments to each other, before anything is built or submitted.
Every error names the parameter and the bad value. `None` means "not given": an explicit argument
overrides `job_template`, which overrides the built-in defaults.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_volcano.constants import DEFAULT_DEBUG_TIMEOUT, DEFAULT_SHM_SIZE
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.hostfile_launch import DEFAULT_PORT, DEFAULT_SSH_WAIT_TIMEOUT, LAUNCHERS, HostfileLaunch
from airflow_volcano.kubelet import ExpandVars, container_string
from airflow_volcano.manifest.checks import (
    CONFIGMAP_KEY,
    PULL_POLICIES,
    QUANTITY,
    QUANTITY_NUMBER,
    RESTART_POLICIES,
    check_key,
    check_label,
    check_not_reserved,
    check_shell_env_names,
    check_type,
    choice,
    env_list,
    integer,
    resource_requirements,
    seconds,
    stall_seconds,
)
from airflow_volcano.manifest.launchers import hostfile_options, torchrun_options
from airflow_volcano.manifest.names import DNS_LABEL
from airflow_volcano.manifest.policies import (
    DEFAULT_RETRYABLE_EXIT_CODES,
    RESTART_SCOPES,
    exit_code_policies,
    validate_policies,
)

MAX_CONFIGMAP_BYTES = 1024 * 1024
TENSORBOARD_PORT = 6006
JINJA = re.compile(r"{{|{%")  # what makes a string a Jinja template (Airflow's default delimiters)
TENSORBOARD_KEYS = {"logdir", "image", "port", "resources"}


class JobKind(StrEnum):
    """Which Job the request builds, and so where its pod arguments go."""

    GENERIC = "generic"  # VolcanoJobOperator: the Job a template describes; pod arguments to every task
    PYTORCH = "pytorch"  # master and workers with Volcano's pytorch plugin (python or torchrun)
    HOSTFILE = "hostfile"  # master and workers, the master launching over ssh (DeepSpeed, mpirun)


@dataclass(frozen=True)
class TrainingScript:
    """A local training script already read by the caller."""

    filename: str
    content: str


# A check: (parameter, value) -> the value to use (templated numbers converted); raises JobSpecError.
Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Lands:
    """Where an argument lands in the Job, when it is one field set as given: `job` (the Job's spec),
    `pod` (the pod template's spec of every task the pod arguments go to) or `container` (their first
    container), under `key`; `convert` turns the checked value into the field's (None: as is). An
    argument without a Lands is applied by a builder of its own (manifest.build)."""

    where: str  # "job" | "pod" | "container"
    key: str
    convert: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Variant:
    """What an argument shared by two groups is for one of them: its default and doc text there
    (`port` and `launcher` are PyTorch's and DeepSpeed's, with different defaults)."""

    default: Any
    doc: str


def argument(check: Check | None = None, default: Any = None, *, doc: str, group: str = "job",
             lands: Lands | tuple[Lands, ...] | None = None, templated: bool = False, number: bool = False,
             accepts: str | None = None, request_default: bool = False,
             variants: dict[str, Variant] | None = None, default_source: str | None = None) -> Any:
    """An operator argument's one declaration, as a dataclass field named like the argument (of JobRequest,
    or of operators.arguments.OperatorArguments for the arguments the Job is not built from). It says:

    :param check: what checks (and, for templated numbers, converts) a given value: `normalize` runs it on
        JobRequest's, the operator's construction on OperatorArguments'.
    :param default: the operators' default, written in their signatures. JobRequest's own field defaults to
        None ("not given") unless `request_default`, where a request built without an operator needs it too.
    :param doc: the argument's text: its `:param` line in the operators' docstrings and the docs' tables.
    :param group: which operators take it: `job` (every one), `roles` (master/worker), `pytorch`,
        `hostfile` (DeepSpeed), or several, as a `|`-separated text.
    :param lands: where it lands in the Job, when it is one field set as given.
    :param templated: whether the operators template it (their `template_fields` are derived from this).
    :param number: an integer that, templated, may come as a Jinja string: any other string (but digits) fails at
        the operator's construction (a DAG's parse).
    :param accepts: the type the operators take, when it is not the field's (the field holds what the
        operator makes of it: a TrainingScript read from the path given).
    :param variants: the default and doc text for a group other than the first of `group`.
    :param default_source: the default as the signatures write it, when it is read from the configuration.
    """
    places = lands if isinstance(lands, tuple) else (lands,) if lands is not None else ()
    return field(default=default if request_default else None,
                 metadata={"check": check, "lands": places, "templated": templated, "doc": doc,
                           "groups": tuple(group.split("|")), "default": default, "number": number,
                           "accepts": accepts, "variants": variants or {},
                           "default_source": default_source})


def _integer(minimum: int, maximum: int | None = None, why: str = "") -> Check:
    return lambda parameter, value: integer(parameter, value, minimum, maximum, why)


def _text(parameter: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise JobSpecError(f"{parameter} must be a non-empty string, got {value!r}")
    return value


def _dns_label(parameter: str, value: Any) -> str:
    _text(parameter, value)
    if not DNS_LABEL.match(value) or len(value) > 63:
        raise JobSpecError(f"{parameter} {value!r} is not a DNS label (lowercase letters, digits and '-', <= 63)")
    return value


def _one_of(allowed: set[str]) -> Check:
    def check(parameter: str, value: Any) -> Any:
        choice(parameter, value, allowed)
        return value

    return check


def _list_of(*kinds: type) -> Check:
    def check(parameter: str, value: Any) -> Any:
        check_type(parameter, value, list, kinds)
        return value

    return check


def _mapping(parameter: str, value: Any) -> Any:
    check_type(parameter, value, dict)
    return value


def _labels(parameter: str, value: Any) -> Any:
    check_type(parameter, value, dict)
    for key, label in value.items():
        check_label(parameter, str(key), str(label))
    if parameter == "labels":
        check_not_reserved(parameter, value)
    return value


def _annotations(parameter: str, value: Any) -> Any:
    check_type(parameter, value, dict)
    for key in value:
        check_key(parameter, str(key))
    check_not_reserved(parameter, value)
    return value


def _policies(parameter: str, value: Any) -> Any:
    check_type(parameter, value, list, dict)
    validate_policies(parameter, value)
    return value


def _plugins(parameter: str, value: Any) -> Any:
    check_type(parameter, value, dict)
    for plugin, plugin_args in value.items():
        check_type(f"{parameter}[{plugin!r}]", plugin_args, list, str)
    return value


def _resources(parameter: str, value: Any) -> Any:
    resource_requirements(parameter, value)  # checked here, merged per role when built
    return value


def _env(parameter: str, value: Any) -> list[dict]:
    # The process gets each value as given: `$(VAR)` is not expanded unless it is ExpandVars.
    return [{**item, "value": container_string(item["value"])} if "value" in item else item
            for item in env_list(value)]


def _wait_for_master(parameter: str, value: Any) -> Any:
    if not isinstance(value, bool) and (not isinstance(value, str) or not value.strip()):
        raise JobSpecError(f"{parameter} must be True/False or the image of the init container (with sh and nc), "
                           f"got {value!r}")
    return value


def _script(parameter: str, value: Any) -> Any:
    check_script(value)
    return value


def _tensorboard(parameter: str, value: Any) -> Any:
    return tensorboard_options(value)


def _quantity(parameter: str, value: Any) -> str:
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    number = QUANTITY_NUMBER.match(text)
    if not QUANTITY.match(text) or text.startswith("-") or number is None or float(number[0]) <= 0:
        raise JobSpecError(f"{parameter} must be a positive Kubernetes quantity such as '2Gi' or '512Mi' (None to "
                           f"turn it off), got {value!r}")
    return text


def _absolute_path(parameter: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or \
            any(part in (".", "..") for part in value.split("/")):
        raise JobSpecError(f"{parameter} must be an absolute path without '.' or '..' parts, got {value!r}")
    return value.rstrip("/") or "/"


def _container_strings(values: list[Any]) -> list[Any]:
    """Command or args as the process gets them: no `$(VAR)` expansion unless ExpandVars."""
    return [container_string(part) for part in values]


def _pull_secret_names(parameter: str, value: Any) -> list[str]:
    """Names, or the references KubernetesPodOperator takes (`{"name": ...}`, `k8s.V1LocalObjectReference`)."""
    check_type(parameter, value, list)
    names = [item.get("name") if isinstance(item, dict) and set(item) == {"name"} else item for item in value]
    if not all(isinstance(name, str) and name.strip() for name in names):
        raise JobSpecError(f"{parameter} must be a list of secret names (or {{'name': ...}} references), got {value!r}")
    return [str(name) for name in names]


def _pull_secrets(names: list[str]) -> list[dict]:
    return [{"name": name} for name in names]


@dataclass
class JobRequest:
    """The operators' arguments for building a Job: a field is an operator argument of the same name,
    declared once (`argument`); `kind` says which Job it builds."""

    kind: JobKind = JobKind.PYTORCH
    # -- the Job ------------------------------------------------------------------------------------
    name: str | None = argument(
        _text, templated=True,
        doc="Job name. Default `<dag_id>-<task_id>-<6 hex>`, made a DNS label (lowercase, starting with a letter) "
            "and shortened so that every pod name `<job>-<task>-<index>` (also the pod's hostname) is at most 63 "
            "characters. A name given is used as it is: one that is not such a label, or too long for that, fails "
            "before submitting.")
    namespace: str | None = argument(
        _dns_label, templated=True, doc="default: the connection's namespace, else `default`.")
    job_template: dict | None = argument(
        _mapping, templated=True, accepts="str | dict | None",  # parsed by the operator (a file or text)
        doc="the escape hatch: a Volcano Job as a dict, as YAML/JSON text, or as the path of a `.yaml`, `.yml` or "
            "`.json` file, found like `training_script` and rendered with Jinja like any template file. An "
            "explicit argument overrides the template's field. Only this argument is ever read as a file: strings "
            "ending in `.yaml` or `.json` in other arguments (`args=[\"--config\", \"conf/train.yaml\"]`, "
            "`env={\"CFG\": \"x.json\"}`) are values, only rendered. Not with `full_job_spec`.")
    full_job_spec: dict | None = argument(
        _mapping, templated=True,
        doc="a whole Job dict, used as is apart from its name, namespace, labels and annotations (the provider's "
            "labels are added). Any other argument the Job is built from is refused with it (`job_template` is the "
            "way to override fields), and its pods get nothing the provider adds around a training command (signal "
            "forwarding, `/dev/shm`, `CHECKPOINT_DIR`, the restart counters).")
    main_task: str | None = argument(
        _dns_label, templated=True,
        doc="the task whose pod 0 is the Job's main pod, followed for the log, the result and TensorBoard's "
            "volume: default the pytorch plugin's master if the Job has one, else its first task.")
    labels: dict[str, str] | None = argument(
        _labels, templated=True,
        doc="added to the Job and every pod. Keys `airflow-volcano.io/*` and `app.kubernetes.io/managed-by` are "
            "the provider's and refused; keys and values must be valid Kubernetes labels.")
    annotations: dict[str, str] | None = argument(
        _annotations, templated=True,
        doc="added to the Job and every pod. Keys `airflow-volcano.io/*` and `app.kubernetes.io/managed-by` are "
            "the provider's and refused.")
    priority_class_name: str | None = argument(
        _text, templated=True, lands=(Lands("job", "priorityClassName"), Lands("pod", "priorityClassName")),
        doc="the PriorityClass of the Job and of its pods, for Volcano's scheduling.")
    volcano_queue: str | None = argument(
        _text, templated=True, lands=Lands("job", "queue"),
        doc="the Volcano queue (default `default`; not `queue`, which is Airflow's own argument of every "
            "operator). A queue that does not exist, is not Open, or whose capability is less than the Job's gang "
            "needs is refused before submitting, naming `volcano_queue`, when the queue can be read "
            "(deploy/queue-reader.yaml).")
    scheduler_name: str | None = argument(
        _text, lands=Lands("job", "schedulerName"), doc="the Job's scheduler (default `volcano`).")
    # Volcano's webhook treats 0 as "unset" and substitutes a default: refuse it rather than surprise.
    min_available: int | str | None = argument(
        _integer(1, None, " (Volcano's webhook turns 0 into all replicas)"), templated=True, number=True,
        doc="gang size: Volcano starts the Job once this many of its pods fit. Default the template's; all "
            "replicas (gang scheduling) in a Job built without one. At least 1 (Volcano's webhook turns 0 into "
            "all replicas), at most the replica total.")
    max_retry: int | None = argument(
        _integer(1, None, " (Volcano's webhook turns 0 into 3)"), lands=Lands("job", "maxRetry"),
        doc="the retry budget of restarts after a failure: a retryable exit, an eviction, a lost node, a stall "
            "(default 3, at least 1: Volcano's webhook turns 0 into 3). Volcano counts the restart that finds the "
            "budget spent, so `max_retry=N` allows N - 1 restarts. Preemptions do not spend it: see "
            "`max_preemptions`.")
    max_preemptions: int | None = argument(
        _integer(0),
        doc="how many times the Job may be preempted (its pods evicted by Volcano's scheduler for a higher-priority "
            "Job, or by a queue reclaiming its share) and wait for room again, beside `max_retry`, which preemptions "
            "do not spend (default 10; 0: the first preemption fails the task). The one after the last allowed ends "
            "the Job, and the task fails naming `max_preemptions`. Volcano's `maxRetry` is submitted as "
            "`max_retry + max_preemptions + 1`, a backstop, and the task holds the restarts that were not "
            "preemptions to `max_retry` (docs/failures.md). Not with `full_job_spec`, which is submitted as is.")
    ttl_seconds_after_finished: int | None = argument(
        _integer(0), lands=Lands("job", "ttlSecondsAfterFinished"),
        doc="Volcano garbage-collects the Job this many seconds after it ends.")
    policies: list[dict] | None = argument(
        _policies, lands=Lands("job", "policies"),
        doc="the Job's Volcano lifecycle policies, replacing those `retryable_exit_codes` builds (it cannot be "
            "combined with `retryable_exit_codes` or `restart_scope`). Unknown events and actions are refused "
            "before submitting.")
    retryable_exit_codes: list[int] | None = argument(  # checked with restart_scope, as they build policies
        doc="exit codes that restart (default 130, 137, 138, 143: a signal, the OOM killer or a preemption, as "
            "T9k, a Kubernetes ML platform, restarts its training jobs; `[]`: none); an evicted pod restarts too. "
            "Any other failure ends the Job at once, naming the pod and its code. Codes 1 to 255, each once.")
    restart_scope: str | None = argument(
        _one_of(set(RESTART_SCOPES)),
        doc="what a retryable exit or an eviction restarts: `job` (the gang, default) or `task` (the pods of the "
            "failed pod's task).")
    extra_plugins: dict[str, list[str]] | None = argument(
        _plugins,
        doc='more Volcano plugins and their arguments, e.g. `{"env": [], "ssh": []}` (Volcano\'s own plugins '
            "only). The Job built without a template always lists `svc`.")
    tensorboard: dict[str, Any] | None = argument(
        _tensorboard, templated=True,
        doc='`{"logdir": "/logs/tb"}`, optionally with `image` (default the master\'s, which must have the '
            "`tensorboard` package), `port` (default 6006) and `resources`: adds a one-pod task `tensorboard` "
            "serving the event files the training writes under `logdir`. `logdir` must be on a volume the master "
            "mounts that other pods can read (a PVC, NFS, hostPath), which that pod mounts read-only; a `logdir` "
            "outside every mount, or on an `emptyDir`, fails before submitting. The pod is not a rank "
            "(`WORLD_SIZE` counts master and workers only), not part of the gang, restarts alone if it fails, and "
            "ends with the Job.")
    # -- the pods -----------------------------------------------------------------------------------
    image: str | None = argument(
        _text, templated=True, lands=Lands("container", "image"),
        doc="container image of the pods (required unless the template has one).")
    command: list[Any] | None = argument(
        _list_of(str, int, float, ExpandVars), templated=True, lands=Lands("container", "command", _container_strings),
        doc="container command; `python <script>` when `training_script` is given. Each string reaches the "
            "process exactly as given: the kubelet does not expand `$(VAR)` in it unless it is wrapped in "
            "`ExpandVars(...)`. VolcanoPyTorchJobOperator with `launcher=\"torchrun\"` builds it and refuses one.")
    args: list[Any] | None = argument(
        _list_of(str, int, float, ExpandVars), templated=True, lands=Lands("container", "args", _container_strings),
        doc="container args (with `training_script`, the script's arguments). Each string reaches the process "
            "exactly as given: the kubelet does not expand `$(VAR)` in it unless it is wrapped in "
            "`ExpandVars(...)`. Strings ending in `.yaml` or `.json` here are values, not files.")
    env: dict[str, Any] | list[dict] | None = argument(
        _env, templated=True, lands=Lands("container", "env"),
        doc="environment: a dict, or a list of EnvVar dicts or `k8s.V1EnvVar` (`valueFrom` allowed), each name "
            "once. Values reach the process exactly, as `args` do (`ExpandVars(...)` opts in to `$(VAR)`). The "
            "values of names Airflow hides (token, password, secret, api_key and the like) are masked in the "
            "rendered Job, `dry_run()` and the task log. For a DeepSpeed or mpirun launch, names must be shell "
            "names (letters, digits, `_`).")
    container_resources: dict | None = argument(
        _resources, templated=True,
        doc='`{"cpu": "4", "memory": "16Gi", "gpu": 1}` (requests = limits; `gpu` is `nvidia.com/gpu`) or '
            '`{"requests": {...}, "limits": {...}}` (or a `k8s.V1ResourceRequirements`), for every pod the pod '
            "arguments go to. Not `resources`: that is Airflow's own argument (the executor's), and pod "
            "resources given there fail naming this one.")
    node_selector: dict[str, str] | None = argument(
        _labels, templated=True, lands=Lands("pod", "nodeSelector"),
        doc="the pods' nodeSelector.")
    tolerations: list[dict] | None = argument(
        _list_of(dict), templated=True, lands=Lands("pod", "tolerations"),
        doc="the pods' tolerations (dicts or `k8s.V1Toleration`).")
    volumes: list[dict] | None = argument(
        _list_of(dict), templated=True, lands=Lands("pod", "volumes"),
        doc="the pods' volumes (dicts or `k8s.V1Volume`).")
    volume_mounts: list[dict] | None = argument(
        _list_of(dict), templated=True, lands=Lands("container", "volumeMounts"),
        doc="volumeMounts of each pod's first container (dicts or `k8s.V1VolumeMount`); each must name a volume "
            "of the pod.")
    service_account_name: str | None = argument(
        _text, templated=True, lands=Lands("pod", "serviceAccountName"), doc="the pods' service account.")
    image_pull_policy: str | None = argument(
        _one_of(PULL_POLICIES), lands=Lands("container", "imagePullPolicy"),
        doc="the containers' imagePullPolicy: `Always`, `IfNotPresent` or `Never`.")
    image_pull_secrets: list[str] | None = argument(
        _pull_secret_names, lands=Lands("pod", "imagePullSecrets", _pull_secrets),
        doc="names of the pods' pull secrets (or `k8s.V1LocalObjectReference`).")
    restart_policy: str | None = argument(
        _one_of(RESTART_POLICIES), lands=Lands("pod", "restartPolicy"),
        doc="the pods' restartPolicy (default `Never`: every failure reaches Volcano, instead of the kubelet "
            "restarting one pod in place while the others wait).")
    training_script: TrainingScript | None = argument(
        _script, templated=True, accepts="str | None",  # read by the operator
        doc="a local file, relative to the DAG file's folder or the DAG's `template_searchpath` (an absolute path "
            "must lie inside one of them or of `allowed_file_dirs`; after rendering, `../` cannot leave them), "
            "shipped as the ConfigMap `<job>-script` owned by the Job (at most 1 MiB), mounted read-only in every "
            "pod and run there by `launcher`: `python <script>` unless `command` is given.")
    debug: bool | None = argument(
        default=False, accepts="bool",
        doc="debug mode (as in T9k, a Kubernetes ML platform): the pods come up as configured but sleep instead "
            "of running their command; the task log says how to open a shell in each (`kubectl exec`); the Job "
            "is deleted after `debug_timeout` or when the task is marked success/failed. Waits in the worker.")
    debug_timeout: float | datetime.timedelta = argument(
        seconds, DEFAULT_DEBUG_TIMEOUT, request_default=True,
        doc="seconds (or a timedelta) the debug pods stay up (default 3600).")
    # None turns it off (unlike the other fields, whose None means "not given").
    shm_size: str | None = argument(
        _quantity, DEFAULT_SHM_SIZE, request_default=True,
        doc="size limit, a Kubernetes quantity, of the memory-backed `emptyDir` mounted at `/dev/shm` in every "
            "training pod (default `2Gi`; a container's own is 64 MiB, and a DataLoader with workers dies with "
            "\"bus error\"). Its pages count against the container's memory limit only as they are written. "
            "`None` turns it off. A `/dev/shm` volume of your own (the template's or `volume_mounts`') wins over "
            "the default; with a `shm_size` other than the default it is an error.")
    termination_grace_period: int | None = argument(
        _integer(0),
        doc="seconds a deleted pod's processes have between SIGTERM and SIGKILL (Kubernetes' default 30) when a "
            "pod is deleted (a kill, `job_timeout`, a restart, a preemption): time for a script that saves a "
            "checkpoint on SIGTERM. Every training command runs under a small `sh` that passes SIGTERM on to the "
            "training processes, so a script without a handler ends at once.")
    checkpoint_dir: str | None = argument(
        _absolute_path, templated=True,
        doc="an absolute path on a volume every training pod mounts and shares (a PVC, NFS, hostPath; an "
            "`emptyDir` or a path outside every mount fails before submitting). Every rank gets `CHECKPOINT_DIR`, "
            "`<checkpoint_dir>/<dag_id>/<task_id>[-<map_index>]/<run_id>`, created at start and the same across "
            "Volcano's restarts and Airflow's retries of the task instance. A main-pod log line `[airflow-volcano] "
            "resumed from <checkpoint>` is reported as the result's `resumed_from`.")
    # Also the wait's (WaitLimits, with stall_action); in the pods it adds what prints the Python stacks.
    stall_timeout: float | datetime.timedelta | None = argument(
        stall_seconds,  # seconds once checked
        doc="seconds (at least 30; a smaller number is refused, naming the unit) or a timedelta; off by default. "
            "A Running Job whose followed pods (the main pod, `log_tasks`' pods, a DeepSpeed/mpirun launch's "
            "ranks) write nothing, not a byte (a progress bar redrawn in place is output), and which does not "
            "change, for this long has stalled. Time the waiter cannot read their logs does not count, and a "
            "stall is confirmed by a fresh read of each before anything is done. The task log then gets the "
            "Python stack of every thread of every Python process in each training pod (a `faulthandler` "
            "installed through a `sitecustomize` the operator ships), and `stall_action` applies. A script that "
            "is quiet on purpose touches `$HEARTBEAT_FILE` instead of printing. Needs `get_logs=True`, and "
            "`patch` on pods (deploy/rbac.yaml).")
    # -- master and workers (PYTORCH, HOSTFILE) ------------------------------------------------------
    worker_replicas: int | str | None = argument(
        _integer(0), templated=True, number=True, group="roles",
        doc="number of workers (>= 0; default 1, or the template's); there is always exactly one master.")
    master_task_name: str | None = argument(
        _dns_label, group="roles",
        doc="master task name (default `master`), passed to the pytorch plugin as `--master`.")
    worker_task_name: str | None = argument(
        _dns_label, group="roles",
        doc="worker task name (default `worker`, not the master's), passed to the pytorch plugin as `--worker`.")
    master_resources: dict | None = argument(
        _resources, templated=True, group="roles",
        doc="like `container_resources`, merged over it for the master.")
    worker_resources: dict | None = argument(
        _resources, templated=True, group="roles",
        doc="like `container_resources`, merged over it for the workers.")
    master_policies: list[dict] | None = argument(
        _policies, group="roles",
        doc="master task policies (default: TaskCompleted -> CompleteJob: the Job succeeds when the master "
            "does, whatever workers still run).")
    port: int | None = argument(
        _integer(1, 65535), group="pytorch|hostfile",
        doc="the pytorch plugin's `--port` (MASTER_PORT), default 23456.",
        variants={"hostfile": Variant(DEFAULT_PORT, "the rendezvous port on the first worker (MASTER_PORT, "
                                                    "default 29500).")})
    launcher: str | None = argument(  # checked by kind: python/torchrun, or deepspeed/mpirun
        group="pytorch|hostfile",
        doc="`python` (default: one process per pod, Volcano's RANK/WORLD_SIZE count pods) or `torchrun` (one "
            "agent per pod starting `nproc_per_node` processes; torch's RANK and WORLD_SIZE then count "
            "processes; it needs `training_script`). Elastic when `min_available` is below master + workers.",
        variants={"hostfile": Variant(LAUNCHERS[0], "`deepspeed` (default: DeepSpeed's runner, pdsh over ssh; "
                                      "DeepSpeed's launch sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT in "
                                      "each rank) or `mpirun` (OpenMPI; ranks read OMPI_COMM_WORLD_RANK/SIZE, or "
                                      "let `deepspeed.init_distributed()` discover them through mpi4py; "
                                      "MASTER_ADDR/MASTER_PORT are passed).")})
    # -- PYTORCH ------------------------------------------------------------------------------------
    nproc_per_node: int | str | None = argument(  # an int or torchrun's names: checked with the launcher
        templated=True, group="pytorch",
        doc="torchrun's processes per pod: an int, or `auto`, `gpu`, `cpu` (default 1). Only with "
            "`launcher=\"torchrun\"`.")
    max_restarts: int | None = argument(
        _integer(0), group="pytorch",
        doc="torchrun's own in-pod restart budget: restarts of a pod's processes before the pod fails. Only with "
            "`launcher=\"torchrun\"`.")
    torchrun_options: list[str] | None = argument(  # checked with the launcher
        templated=True, group="pytorch",
        doc='more torchrun flags, e.g. `["--rdzv_conf=last_call_timeout=5"]`. Node count, ranks, rendezvous, '
            "processes per pod and restarts are the operator's (`nproc_per_node`, `max_restarts`, "
            "`min_available`) and refused here, under any abbreviation torchrun accepts (`--nnode=4`). Only with "
            "`launcher=\"torchrun\"`.")
    wait_for_master: bool | str | None = argument(
        _wait_for_master, default=False, accepts="bool | str", group="pytorch",
        doc="workers wait in an init container until the master accepts connections on MASTER_PORT (Volcano "
            "1.14+'s pytorch plugin option; up to 300 s, then the pod fails): True (Volcano's default busybox "
            "image) or the image to use (it needs sh and nc).")
    # -- HOSTFILE -----------------------------------------------------------------------------------
    slots_per_worker: int | str | None = argument(
        _integer(1), 1, templated=True, number=True, group="hostfile",
        doc="ranks per worker pod, the hostfile's `slots` (default 1; one per GPU).")
    launcher_options: list[str] | None = argument(  # checked with the launcher
        templated=True, group="hostfile",
        doc='more launcher flags, before the script, each one word, e.g. `["--bind_cores_to_rank"]` or '
            '`["--mca", "btl", "tcp,self"]`. Hostfile, hosts, rank counts and rendezvous are the operator\'s and '
            "refused here (for `deepspeed` under any abbreviation its argparse accepts: `--hostf=...`); for "
            "`deepspeed`, `--module`, `--no_python` and `--autotuning` are refused too, and the values of "
            "`--venv_script` and `--enable_each_rank_log` must be plain words (letters, digits, `_@%+=:,./-`).")
    ssh_wait_timeout: int | None = argument(
        _integer(1), DEFAULT_SSH_WAIT_TIMEOUT, group="hostfile",
        doc="seconds the master waits for every worker's sshd before failing with the host that did not answer "
            "(default 300).")
    # Not an argument: the checked launch of a HOSTFILE Job, set by `normalize`.
    hostfile_launch: HostfileLaunch | None = field(default=None, metadata={"check": None, "derived": True})


def template_or_integer(parameter: str, value: Any) -> None:
    """A templated integer given as text must be a Jinja template (rendered, then checked, when the task
    runs) or an integer's digits: `worker_replicas="two"` fails when the DAG is parsed, not at run time."""
    if isinstance(value, str) and not JINJA.search(value) and not re.fullmatch(r"\s*-?\d+\s*", value):
        raise JobSpecError(f"{parameter}={value!r} is neither an integer nor a Jinja template")


def arguments(request_type: type = JobRequest) -> list[str]:
    """The names of JobRequest's fields that are operator arguments."""
    return [item.name for item in dataclasses.fields(request_type)
            if item.name != "kind" and not item.metadata.get("derived")]


def templated_arguments() -> frozenset[str]:
    """The arguments the operators template (the docs' argument tables: templated)."""
    return frozenset(item.name for item in dataclasses.fields(JobRequest) if item.metadata.get("templated"))


def landings(where: str) -> list[tuple[str, Lands]]:
    """(argument, where it lands) of every argument set as one field at `where` (job, pod, container)."""
    return [(item.name, lands) for item in dataclasses.fields(JobRequest)
            for lands in item.metadata.get("lands") or () if lands.where == where]


def normalize(req: JobRequest) -> JobRequest:
    """Check every given argument (its own check, then the rules relating arguments) and convert
    templated numbers; returns a checked copy."""
    changes: dict[str, Any] = {}
    for item in dataclasses.fields(req):
        check, value = item.metadata.get("check"), getattr(req, item.name)
        if check is not None and value is not None:
            changes[item.name] = check(item.name, value)
    req = dataclasses.replace(req, **changes)
    changes = {}
    if req.master_task_name and req.master_task_name == req.worker_task_name:
        raise JobSpecError(f"duplicate task name {req.master_task_name!r}: master_task_name and worker_task_name "
                           "must differ")
    if req.retryable_exit_codes is not None or req.restart_scope is not None:
        if req.policies is not None:
            raise JobSpecError("policies cannot be combined with retryable_exit_codes/restart_scope, which build the "
                               "Job's policies: give one or the other")
        check_type("retryable_exit_codes", req.retryable_exit_codes, list, int)
        codes = [integer("retryable_exit_codes", code, 1, 255) for code in req.retryable_exit_codes or []]
        if len(set(codes)) != len(codes):
            raise JobSpecError(f"retryable_exit_codes: duplicate exit code in {codes!r}")
        changes["policies"] = exit_code_policies(DEFAULT_RETRYABLE_EXIT_CODES if req.retryable_exit_codes is None
                                                 else codes, req.restart_scope or "job")
    if req.kind is JobKind.HOSTFILE:
        check_shell_env_names("env", req.env if isinstance(req.env, list) else [])
        changes["hostfile_launch"] = hostfile_options(req)
    else:
        changes.update(torchrun_options(req))
    return dataclasses.replace(req, **changes)


def check_script(script: TrainingScript) -> None:
    if not isinstance(script, TrainingScript):
        raise JobSpecError(f"training_script must be a TrainingScript, got {script!r}")
    if not CONFIGMAP_KEY.match(script.filename) or len(script.filename) > 253:
        raise JobSpecError(f"training_script: file name {script.filename!r} is not a valid ConfigMap key "
                           "(letters, digits, '-', '_', '.')")
    size = len(script.content.encode()) + len(script.filename.encode())
    if size > MAX_CONFIGMAP_BYTES:
        raise JobSpecError(f"training_script {script.filename!r} is {size} bytes; a ConfigMap holds at most "
                           f"{MAX_CONFIGMAP_BYTES}: bake it into the image or mount a volume instead")


def tensorboard_options(options: Any) -> dict[str, Any]:
    check_type("tensorboard", options, dict)
    unknown = sorted(set(options) - TENSORBOARD_KEYS)
    if unknown:
        raise JobSpecError(f"tensorboard: unknown key(s) {', '.join(map(repr, unknown))} "
                           f"(known: {', '.join(sorted(TENSORBOARD_KEYS))})")
    logdir = options.get("logdir")
    if not isinstance(logdir, str) or not logdir.startswith("/"):
        raise JobSpecError(f"tensorboard: logdir must be an absolute path in the master's file system, got {logdir!r}")
    checked = {"logdir": logdir.rstrip("/") or "/", "port": TENSORBOARD_PORT}
    if options.get("port") is not None:
        checked["port"] = integer("tensorboard: port", options["port"], 1, 65535)
    if options.get("image") is not None:
        if not isinstance(options["image"], str) or not options["image"].strip():
            raise JobSpecError(f"tensorboard: image must be a non-empty string, got {options['image']!r}")
        checked["image"] = options["image"]
    checked["resources"] = resource_requirements("tensorboard: resources", options.get("resources"))
    return checked
