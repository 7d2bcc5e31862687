"""Operator arguments -> a validated Volcano Job manifest (and the training-script ConfigMap).

Pure: no Airflow, no network. Precedence: an explicit argument overrides `job_template`, which
overrides the built-in defaults; defaults are never injected into a template, so a template
submits as written apart from our labels. Every error names the parameter and the bad value.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from airflow_volcano import hostfile_launch, shell
from airflow_volcano.constants import (
    DEBUG_ANNOTATION,
    IDENTITY_KEYS,
    JOB_API_VERSION,
    LABEL_PREFIX,
    MANAGED_BY_LABEL,
    MANAGED_BY_VALUE,
    SCRIPT_MOUNT_PATH,
    TRY_NUMBER_LABEL,
)
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.hostfile_launch import HostfileLaunch
from airflow_volcano.kubelet import ExpandVars, container_string, process_string
from airflow_volcano.shell.hostfile_argv import INERT as INERT_WORD

SCRIPT_VOLUME = "training-script"
MAX_CONFIGMAP_BYTES = 1024 * 1024
POD_NAME_MAX = 63  # the pod name is also its hostname (svc plugin), so a DNS label

DEFAULT_MASTER, DEFAULT_WORKER, DEFAULT_PORT = "master", "worker", 23456
DEFAULT_QUEUE, DEFAULT_SCHEDULER, DEFAULT_MAX_RETRY = "default", "volcano", 3
DEFAULT_MASTER_POLICIES = [{"event": "TaskCompleted", "action": "CompleteJob"}]
# DDP cannot lose a rank: an evicted pod, or one killed by a signal (T9k's retryable exit codes:
# SIGINT 130, SIGKILL/OOM 137, SIGUSR2 138, SIGTERM 143), restarts the whole gang within
# max_retry; any other failure is a bug that a restart would only repeat, so it ends the Job at
# once. Pods default to restartPolicy Never so that Volcano sees every failure (a kubelet restart
# of one pod in place would leave the others hanging at the rendezvous).
DEFAULT_RETRYABLE_EXIT_CODES = (130, 137, 138, 143)
RESTART_SCOPES = {"job": "RestartJob", "task": "RestartTask"}
DEFAULT_RESTART_POLICY = "Never"
# The TensorBoard task (seed 004): outside the gang and the ranks, restarted alone if it fails.
TENSORBOARD_TASK = "tensorboard"
TENSORBOARD_PORT = 6006
TENSORBOARD_KEYS = {"logdir", "image", "port", "resources"}
# Debug mode (T9k's: the pods come up as configured, but sleep instead of training): a pod sleeps the
# task's debug_timeout and this margin at most, counted from its own start, so it ends by itself even if
# the task's worker (which deletes the Job after debug_timeout, counted once every pod runs) is gone.
DEBUG_POD_MARGIN_SECONDS = 60
DEFAULT_DEBUG_TIMEOUT = 3600.0
LAUNCHERS = ("python", "torchrun")
NPROC_NAMES = ("auto", "gpu", "cpu")  # torchrun's own values: one process per GPU / per CPU / per GPU else CPU

EVENTS = {"*", "PodFailed", "PodEvicted", "PodPending", "PodRunning", "Unknown", "TaskCompleted", "TaskFailed",
          "JobUpdated"}
ACTIONS = {"AbortJob", "RestartJob", "RestartTask", "RestartPod", "TerminateJob", "CompleteJob", "ResumeJob"}
PLUGINS = {"pytorch", "svc", "env", "ssh", "mpi", "tensorflow", "ray", "hcclrank"}
RESTART_POLICIES = {"Always", "OnFailure", "Never"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}
JOB_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?\Z")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
LABEL_PREFIX_PART = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+\Z")
# Unprefixed container resources Kubernetes knows; anything else needs a domain (nvidia.com/gpu).
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?\Z")


# Request fields whose operator argument has another name (BaseOperator owns `resources` and
# `queue`): errors name the argument the user wrote.
ARGUMENT_NAMES = {"resources": "container_resources", "queue": "volcano_queue"}


def _argument(field: str) -> str:
    return ARGUMENT_NAMES.get(field, field)


@dataclass(frozen=True)
class TrainingScript:
    """A local training script already read by the caller."""

    filename: str
    content: str


@dataclass
class PyTorchJobRequest:
    """Operator arguments; None means "not given" (explicit > job_template > built-in default)."""

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
    retryable_exit_codes: list[int] | None = None
    restart_scope: str | None = None
    master_policies: list[dict] | None = None
    restart_policy: str | None = None
    extra_plugins: dict[str, list[str]] | None = None
    tensorboard: dict[str, Any] | None = None
    launcher: str | None = None
    nproc_per_node: int | str | None = None
    max_restarts: int | str | None = None
    torchrun_options: list[str] | None = None
    debug: bool | None = None
    debug_timeout: float | str = DEFAULT_DEBUG_TIMEOUT  # seconds the debug pods may live (and a margin)
    wait_for_master: bool | str | None = None
    # DeepSpeed/MPI (operators/deepspeed.py): workers run sshd, the master launches over ssh from a hostfile.
    hostfile_launch: HostfileLaunch | None = None
    training_script: TrainingScript | None = None
    job_template: dict | None = None
    full_job_spec: dict | None = None
    # The generic operator: pod arguments and the script go to every task (not master/worker),
    # and `main_task` names the task whose first pod's log is followed and whose result is read.
    all_tasks: bool | None = None
    main_task: str | None = None


@dataclass
class JobManifests:
    job: dict
    configmap: dict | None  # the training-script ConfigMap
    main_task: str = DEFAULT_MASTER  # whose pod 0 is the Job's main pod (log, result, TensorBoard volume)

    def documents(self) -> list[dict]:
        """What to apply, in order: the ConfigMap first (it must exist before the pods that mount it)."""
        return [doc for doc in (self.configmap, self.job) if doc is not None]


# -- names and labels -------------------------------------------------------------------------------


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


def identity_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """run_labels minus the try number: finds this task instance's Job across its tries."""
    return {key: labels[key] for key in IDENTITY_KEYS if key in labels}


def script_configmap_name(job_name: str) -> str:
    return f"{job_name}-script"


def load_job_template(text: str, *, source: str) -> dict:
    """Parse a Job from YAML or JSON; errors name `job_template`, the source and the line."""
    if text.lstrip().startswith("{"):
        try:
            loaded = json.loads(text)  # JSON's own errors give better positions than YAML's
        except json.JSONDecodeError as error:
            try:
                loaded = yaml.safe_load(text)  # a YAML flow mapping also starts with "{"
            except yaml.YAMLError:
                raise JobSpecError(f"job_template {source} is not valid JSON at line {error.lineno}, column "
                                   f"{error.colno}: {error.msg}") from error
        return _check_template(loaded, source)
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise JobSpecError(f"job_template {source} is not valid YAML/JSON{where}: {problem}") from error
    return _check_template(loaded, source)


def _check_template(loaded: Any, source: str) -> dict:
    if not isinstance(loaded, dict):
        raise JobSpecError(f"job_template {source} must be a mapping (a Volcano Job), got {type(loaded).__name__}")
    if loaded.get("apiVersion") != JOB_API_VERSION or loaded.get("kind") != "Job":
        raise JobSpecError(f"job_template {source} must be apiVersion {JOB_API_VERSION}, kind Job; got "
                           f"apiVersion {loaded.get('apiVersion')!r}, kind {loaded.get('kind')!r}")
    return loaded


# -- request checks: types and templated values, before anything is built ---------------------------


def _integer(parameter: str, value: Any, minimum: int = 0, maximum: int | None = None, why: str = "",
             *, allow_str: bool = True) -> int:
    """Airflow templating renders numbers as strings: accept "2", reject "two", 1.5, True, -1.

    A manifest itself (allow_str=False) must hold real integers: the API server rejects "2".
    """
    digits = allow_str and isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value)
    number = int(value) if digits else value
    if isinstance(number, bool) or not isinstance(number, int) or number < minimum or (
            maximum is not None and number > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise JobSpecError(f"{parameter} must be an integer {bound}, got {value!r}{why}")
    return number


def seconds(parameter: str, value: Any) -> float:
    """A duration argument: a number of seconds or a timedelta, > 0. Checked before anything is
    submitted, so "60" fails here with the parameter's name, not later inside the wait."""
    number = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number) or number <= 0:
        raise JobSpecError(f"{parameter} must be a number of seconds > 0 or a timedelta, got {value!r}")
    return float(number)


def optional_seconds(parameter: str, value: Any) -> float | None:
    """As `seconds`, or None: that limit is off."""
    return None if value is None else seconds(parameter, value)


def _check_type(parameter: str, value: Any, kind: type, item: type | tuple[type, ...] | None = None) -> None:
    if value is None:
        return
    if not isinstance(value, kind):
        raise JobSpecError(f"{parameter} must be a {kind.__name__}, got {value!r}")
    items = item if isinstance(item, tuple) else (item,) if item is not None else ()
    if items and any(not isinstance(element, items) or isinstance(element, bool) for element in value):
        names = " or ".join(kind.__name__ for kind in items)
        raise JobSpecError(f"{parameter} must be a {kind.__name__} of {names}, got {value!r}")


def _choice(parameter: str, value: str | None, allowed: set[str]) -> None:
    if value is not None and value not in allowed:
        raise JobSpecError(f"{parameter} must be one of {', '.join(sorted(allowed))}; got {value!r}")


def _normalize(req: PyTorchJobRequest) -> PyTorchJobRequest:
    """Check every given argument and coerce templated numbers; returns a checked copy."""
    ints = {
        "worker_replicas": (0, None, ""),
        "port": (1, 65535, ""),
        # Volcano's webhook treats 0 as "unset" and substitutes the total / 3: refuse it rather than surprise.
        "min_available": (1, None, " (Volcano's webhook turns 0 into all replicas)"),
        "max_retry": (1, None, " (Volcano's webhook turns 0 into 3)"),
        "ttl_seconds_after_finished": (0, None, ""),
        "max_restarts": (0, None, ""),
    }
    changes: dict[str, Any] = {}
    for field, (minimum, maximum, why) in ints.items():
        if getattr(req, field) is not None:
            changes[field] = _integer(field, getattr(req, field), minimum, maximum, why)
    for field in ("name", "namespace", "image", "master_task_name", "worker_task_name", "service_account_name",
                  "priority_class_name", "queue", "scheduler_name"):
        value = getattr(req, field)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise JobSpecError(f"{_argument(field)} must be a non-empty string, got {value!r}")
    for field in ("namespace", "master_task_name", "worker_task_name"):
        value = getattr(req, field)
        if value is not None and (not DNS_LABEL.match(value) or len(value) > 63):
            raise JobSpecError(f"{field} {value!r} is not a DNS label (lowercase letters, digits and '-', <= 63)")
    if req.master_task_name and req.master_task_name == req.worker_task_name:
        raise JobSpecError(f"duplicate task name {req.master_task_name!r}: master_task_name and worker_task_name "
                           "must differ")
    _choice("image_pull_policy", req.image_pull_policy, PULL_POLICIES)
    _choice("restart_policy", req.restart_policy, RESTART_POLICIES)
    for field in ("command", "args"):
        _check_type(field, getattr(req, field), list, (str, int, float, ExpandVars))
    _check_type("image_pull_secrets", req.image_pull_secrets, list, (str, int, float))
    for field in ("tolerations", "volumes", "volume_mounts", "policies", "master_policies"):
        _check_type(field, getattr(req, field), list, dict)
    for field in ("node_selector", "labels", "annotations", "extra_plugins", "job_template", "full_job_spec"):
        _check_type(field, getattr(req, field), dict)
    for plugin, plugin_args in (req.extra_plugins or {}).items():
        _check_type(f"extra_plugins[{plugin!r}]", plugin_args, list, str)
    for parameter in ("labels", "node_selector"):
        for key, value in (getattr(req, parameter) or {}).items():
            _check_label(parameter, str(key), str(value))
    for key in req.annotations or {}:
        _check_key("annotations", str(key))
    for parameter in ("labels", "annotations"):
        _check_not_reserved(parameter, getattr(req, parameter))
    _validate_policies("policies", req.policies)
    _validate_policies("master_policies", req.master_policies)
    _choice("restart_scope", req.restart_scope, set(RESTART_SCOPES))
    if req.retryable_exit_codes is not None or req.restart_scope is not None:
        if req.policies is not None:
            raise JobSpecError("policies cannot be combined with retryable_exit_codes/restart_scope, which build the "
                               "Job's policies: give one or the other")
        _check_type("retryable_exit_codes", req.retryable_exit_codes, list, int)
        codes = [_integer("retryable_exit_codes", code, 1, 255) for code in req.retryable_exit_codes or []]
        if len(set(codes)) != len(codes):
            raise JobSpecError(f"retryable_exit_codes: duplicate exit code in {codes!r}")
        scope = req.restart_scope or "job"
        changes["policies"] = exit_code_policies(DEFAULT_RETRYABLE_EXIT_CODES if req.retryable_exit_codes is None
                                                 else codes, scope)
    if req.env is not None:
        # The process gets each value as given: `$(VAR)` is not expanded unless it is ExpandVars.
        changes["env"] = [{**item, "value": container_string(item["value"])} if "value" in item else item
                          for item in _env_list(req.env)]
    if req.hostfile_launch is not None:
        _check_shell_env_names("env", changes.get("env") or [])
    if req.training_script is not None:
        _check_script(req.training_script)
    for field in ("resources", "master_resources", "worker_resources"):
        _resources(_argument(field), getattr(req, field))  # checked here, merged per role later
    if req.tensorboard is not None:
        changes["tensorboard"] = _tensorboard_options(req.tensorboard)
    changes.update(_launcher_options(req))
    if req.hostfile_launch is not None:
        changes["hostfile_launch"] = _hostfile_launch_options(req)
    if req.wait_for_master is not None and not isinstance(req.wait_for_master, bool) and (
            not isinstance(req.wait_for_master, str) or not req.wait_for_master.strip()):
        raise JobSpecError(f"wait_for_master must be True/False or the image of the init container (with sh and nc), "
                           f"got {req.wait_for_master!r}")
    return dataclasses.replace(req, **changes)


def exit_code_policies(codes: Sequence[int], scope: str) -> list[dict]:
    """Volcano policies: these exit codes restart the gang (or the pod's task), any other failure
    ends the Job at once; an eviction restarts it. Volcano takes the first policy that matches,
    so the exit codes come before PodFailed."""
    restart = RESTART_SCOPES[scope]
    return [*({"exitCode": code, "action": restart} for code in codes),
            {"event": "PodEvicted", "action": restart}, {"event": "PodFailed", "action": "TerminateJob"}]


def retryable_exit_codes(job: Mapping[str, Any]) -> list[int] | None:
    """The exit codes a Job's policies restart; None if its policies do not end it on other failures."""
    policies = (job.get("spec") or {}).get("policies") or []
    terminates = any(policy.get("action") in ("TerminateJob", "AbortJob") and
                     "PodFailed" in [policy.get("event"), *(policy.get("events") or [])] for policy in policies)
    if not terminates:
        return None
    return sorted(policy["exitCode"] for policy in policies
                  if policy.get("exitCode") is not None and str(policy.get("action", "")).startswith("Restart"))


def _launcher_options(req: PyTorchJobRequest) -> dict[str, Any]:
    _choice("launcher", req.launcher, set(LAUNCHERS))
    _check_type("torchrun_options", req.torchrun_options, list, str)
    torchrun_only = [field for field in ("nproc_per_node", "max_restarts", "torchrun_options")
                     if getattr(req, field) is not None]
    if req.launcher != "torchrun":
        if torchrun_only:
            raise JobSpecError(f"{', '.join(torchrun_only)}: only used with launcher='torchrun' "
                               f"(launcher is {req.launcher or 'python'!r})")
        return {}
    if req.training_script is None:
        raise JobSpecError("launcher='torchrun' runs training_script under torchrun: give training_script (or write "
                           "the torchrun command yourself in command=)")
    if req.command is not None:
        raise JobSpecError("launcher='torchrun' builds the command: give args= for the script, not command=")
    nproc = req.nproc_per_node
    if nproc is None:
        nproc = 1
    elif not (isinstance(nproc, str) and nproc in NPROC_NAMES):
        nproc = _integer("nproc_per_node", nproc, 1, None, f" (or one of {', '.join(NPROC_NAMES)})")
    for option in req.torchrun_options or []:
        if managed_flag(option, TORCHRUN_MANAGED, abbreviations=True):
            raise JobSpecError(f"torchrun_options: {option!r} is set by the operator from the Job (nodes, ranks, "
                               "rendezvous); use nproc_per_node/max_restarts/min_available instead")
    return {"nproc_per_node": nproc}


def _hostfile_launch_options(req: PyTorchJobRequest) -> HostfileLaunch:
    options = req.hostfile_launch
    assert options is not None
    _choice("launcher", options.launcher, set(hostfile_launch.LAUNCHERS))
    if req.training_script is None:
        raise JobSpecError(f"launcher={options.launcher!r} runs training_script on every worker: give training_script")
    if req.command is not None:
        raise JobSpecError(f"launcher={options.launcher!r} builds the master's and the workers' commands: give args= "
                           "for the script, not command=")
    if not isinstance(options.options, list | tuple) or not all(isinstance(item, str) for item in options.options):
        raise JobSpecError(f"launcher_options must be a list of strings, got {options.options!r}")
    for option in options.options:
        # DeepSpeed's runner parses its flags with argparse (abbreviations allowed); OpenMPI's mpirun does not.
        if managed_flag(option, hostfile_launch.MANAGED_OPTIONS[options.launcher],
                        abbreviations=options.launcher == "deepspeed"):
            raise JobSpecError(f"launcher_options: {option!r} is set by the operator (hostfile, hosts, ranks, "
                               "rendezvous); use worker_replicas/slots_per_worker/port instead")
        if managed_flag(option, hostfile_launch.UNSUPPORTED_OPTIONS[options.launcher], abbreviations=True):
            raise JobSpecError(f"launcher_options: {option!r} cannot be used: the ranks run training_script as a "
                               f"Python file through {hostfile_launch.ARGV_SHIM}, which carries its arguments encoded")
    _check_remote_values(options.launcher, list(options.options))
    return dataclasses.replace(
        options, options=tuple(options.options),
        slots_per_worker=_integer("slots_per_worker", options.slots_per_worker, 1),
        port=_integer("port", options.port, 1, 65535),
        ssh_wait_timeout=_integer("ssh_wait_timeout", options.ssh_wait_timeout, 1))


def _check_remote_values(launcher: str, options: list[str]) -> None:
    """DeepSpeed's runner writes some flags' values unquoted into the command line each worker's shell
    runs (`--venv_script=X` as `source X;`): those must be shell-inert words."""
    for index, option in enumerate(options):
        if not managed_flag(option, hostfile_launch.REMOTE_VALUE_OPTIONS[launcher], abbreviations=True):
            continue
        value = option.split("=", 1)[1] if "=" in option else (options[index + 1] if index + 1 < len(options) else "")
        if not INERT_WORD.match(value):
            raise JobSpecError(f"launcher_options: {option!r}: DeepSpeed's runner writes this value unquoted into the "
                               f"command line each worker's shell runs; use letters, digits and _@%+=:,./- (got "
                               f"{value!r})")


# torchrun flags the operator derives from the Job; a user's copy would contradict Volcano's view.
TORCHRUN_MANAGED = {"--nnodes", "--node_rank", "--master_addr", "--master_port", "--rdzv_backend", "--rdzv_endpoint",
                    "--rdzv_id", "--nproc_per_node", "--max_restarts", "--standalone"}


def managed_flag(option: str, managed: Iterable[str], *, abbreviations: bool) -> str | None:
    """The managed flag that `option` (`--flag` or `--flag=value`) would set, if any. With
    `abbreviations` (a launcher parsing with argparse, as torchrun and DeepSpeed's runner do) that
    includes any prefix of a long flag (`--nnode=4` is `--nnodes`), `-` and `_` alike, and a short
    flag with its value attached (`-Hhosts`)."""
    name = option.split("=", 1)[0]
    if not name.startswith("-"):
        return None
    for flag in managed:
        if name == flag:
            return flag
        if not abbreviations:
            continue
        spelled, wanted = name.replace("_", "-"), flag.replace("_", "-")
        if wanted.startswith("--") and spelled.startswith("--") and len(spelled) > 2 and wanted.startswith(spelled):
            return flag
        if len(wanted) == 2 and not spelled.startswith("--") and spelled.startswith(wanted):
            return flag
    return None


def torchrun_command(job: dict, req: PyTorchJobRequest, script_path: str) -> list[str]:
    """torchrun in every master/worker pod: one agent per pod, `nproc_per_node` ranks each.

    Volcano's pytorch plugin gives each pod MASTER_ADDR/MASTER_PORT and RANK (0 for the master,
    index + 1 for workers): fixed-size Jobs use torchrun's static rendezvous at the master with
    --node_rank=RANK; a Job whose minAvailable is below its pods is elastic (--nnodes=min:max,
    c10d rendezvous at the master, node ranks assigned by torchrun). The kubelet expands $(VAR)."""
    master, worker = _role_names(job, req)
    pods = sum(int((_find_task(job, name) or {}).get("replicas") or 0) for name in (master, worker))
    min_pods = job["spec"].get("minAvailable")
    flags = [f"--nproc_per_node={req.nproc_per_node}"]
    if isinstance(min_pods, int) and 0 < min_pods < pods:
        flags += [f"--nnodes={min_pods}:{pods}", "--rdzv_backend=c10d", "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)",
                  f"--rdzv_id={job['metadata']['name']}"]
    else:
        flags += [f"--nnodes={pods}", "--node_rank=$(RANK)", "--master_addr=$(MASTER_ADDR)",
                  "--master_port=$(MASTER_PORT)"]
    if req.max_restarts is not None:
        flags.append(f"--max_restarts={req.max_restarts}")
    return ["torchrun", *flags, *map(container_string, req.torchrun_options or []), script_path]


def _tensorboard_options(options: Any) -> dict[str, Any]:
    _check_type("tensorboard", options, dict)
    unknown = sorted(set(options) - TENSORBOARD_KEYS)
    if unknown:
        raise JobSpecError(f"tensorboard: unknown key(s) {', '.join(map(repr, unknown))} "
                           f"(known: {', '.join(sorted(TENSORBOARD_KEYS))})")
    logdir = options.get("logdir")
    if not isinstance(logdir, str) or not logdir.startswith("/"):
        raise JobSpecError(f"tensorboard: logdir must be an absolute path in the master's file system, got {logdir!r}")
    checked = {"logdir": logdir.rstrip("/") or "/", "port": TENSORBOARD_PORT}
    if options.get("port") is not None:
        checked["port"] = _integer("tensorboard: port", options["port"], 1, 65535)
    if options.get("image") is not None:
        if not isinstance(options["image"], str) or not options["image"].strip():
            raise JobSpecError(f"tensorboard: image must be a non-empty string, got {options['image']!r}")
        checked["image"] = options["image"]
    checked["resources"] = _resources("tensorboard: resources", options.get("resources"))
    return checked


def _env_list(env: Any) -> list[dict]:
    if isinstance(env, Mapping):
        items = [{"name": str(key), "value": value if isinstance(value, ExpandVars) else str(value)}
                 for key, value in env.items()]
    elif isinstance(env, list):
        items = copy.deepcopy(env)  # EnvVar dicts pass through: valueFrom is allowed
    else:
        raise JobSpecError(f"env must be a dict or a list of EnvVar dicts, got {env!r}")
    for item in items:
        if not isinstance(item, dict) or not ENV_NAME.match(str(item.get("name", ""))):
            raise JobSpecError(f"env: invalid environment variable {item!r} (names match [-._a-zA-Z][-._a-zA-Z0-9]*)")
        if "value" in item and not isinstance(item["value"], str | ExpandVars):
            raise JobSpecError(f"env: the value of {item['name']!r} must be a string, got {item['value']!r}")
    names = [item["name"] for item in items]
    if duplicates := sorted({name for name in names if names.count(name) > 1}):
        raise JobSpecError(f"env: each variable once; given more than once: {', '.join(map(repr, duplicates))}")
    return items


SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


def _check_shell_env_names(parameter: str, env: list[dict]) -> None:
    """A hostfile launch's ranks get their pod's environment through a shell (the ssh session
    restores it), which cannot carry names such as `MY-VAR` or `my.var`: refuse them, not lose them."""
    for item in env:
        if not SHELL_NAME.match(str(item.get("name", ""))):
            raise JobSpecError(f"{parameter}: {item.get('name')!r} cannot reach the ranks of a DeepSpeed/mpirun "
                               "launch, which get the pod's environment through a shell: use letters, digits and "
                               "'_', not starting with a digit")


def _check_script(script: TrainingScript) -> None:
    if not isinstance(script, TrainingScript):
        raise JobSpecError(f"training_script must be a TrainingScript, got {script!r}")
    if not CONFIGMAP_KEY.match(script.filename) or len(script.filename) > 253:
        raise JobSpecError(f"training_script: file name {script.filename!r} is not a valid ConfigMap key "
                           "(letters, digits, '-', '_', '.')")
    size = len(script.content.encode()) + len(script.filename.encode())
    if size > MAX_CONFIGMAP_BYTES:
        raise JobSpecError(f"training_script {script.filename!r} is {size} bytes; a ConfigMap holds at most "
                           f"{MAX_CONFIGMAP_BYTES}: bake it into the image or mount a volume instead")


def _resources(parameter: str, spec: Any) -> dict[str, dict[str, str]]:
    """{"cpu","memory","gpu",...} shorthand (requests = limits) or {"requests", "limits"}."""
    if spec is None or spec == {}:
        return {}
    if not isinstance(spec, Mapping):
        raise JobSpecError(f"{parameter} must be a mapping, got {spec!r}")
    split = set(spec) & {"requests", "limits"}
    if split and set(spec) - split:
        raise JobSpecError(f"{parameter}: give either the shorthand {{'cpu': ..., 'memory': ...}} or "
                           f"{{'requests': ..., 'limits': ...}}, not both; got {dict(spec)!r}")
    if split:
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
        prefix, _, base = name.rpartition("/")
        known = name in STANDARD_RESOURCES or name.startswith("hugepages-") or (
            prefix and LABEL_PREFIX_PART.match(prefix) and LABEL_NAME.match(base))
        if not known:
            raise JobSpecError(f"{parameter}: unknown resource {key!r} (cpu, memory, ephemeral-storage, gpu, "
                               "hugepages-<size> or a domain-prefixed name such as nvidia.com/gpu)")
        quantity = str(value).strip() if isinstance(value, int | float | str) and not isinstance(value, bool) else ""
        if not QUANTITY.match(quantity) or quantity.startswith("-"):
            raise JobSpecError(f"{parameter}: {key!r} must be a quantity >= 0 such as 2, 500m or 4Gi, got {value!r}")
        out[name] = quantity
    return out


def _merge_resources(shared: dict, role: dict) -> dict:
    merged = {key: dict(value) for key, value in shared.items()}
    for key, value in role.items():
        merged.setdefault(key, {}).update(value)
    return merged


# -- building ----------------------------------------------------------------------------------------


def build_manifests(req: PyTorchJobRequest, *, run_labels: dict[str, str], default_name: str) -> JobManifests:
    """The Job (and ConfigMap) to submit; raises JobSpecError naming the bad parameter."""
    if req.job_template is not None and req.full_job_spec is not None:
        raise JobSpecError("job_template and full_job_spec cannot be combined: give one of them")
    if req.all_tasks and req.job_template is None and req.full_job_spec is None:
        raise JobSpecError("job_template or full_job_spec is required: VolcanoJobOperator runs the Job you describe "
                           "(VolcanoPyTorchJobOperator builds one from arguments)")
    req = _normalize(req)
    if req.full_job_spec is not None:
        allowed = {"name", "namespace", "labels", "annotations", "full_job_spec", "all_tasks", "main_task",
                   "debug_timeout"}  # (debug itself is refused: it changes the commands)
        conflicting = [f.name for f in dataclasses.fields(req) if f.name not in allowed and
                       getattr(req, f.name) is not None]
        if conflicting:
            raise JobSpecError(f"full_job_spec is used as is: {', '.join(conflicting)} cannot be combined with it "
                               "(use job_template to override fields)")
        job, origin = copy.deepcopy(req.full_job_spec), "full_job_spec"
        _check_template_keys(job, origin)
    elif req.job_template is not None:
        job, origin = copy.deepcopy(req.job_template), "job_template"
        _check_template_keys(job, origin)
        _apply_arguments(job, req)
    else:
        job, origin = _default_job(req), "job"
        _apply_arguments(job, req)

    metadata = job.setdefault("metadata", {})
    if req.name is not None:
        metadata["name"] = req.name
    elif not metadata.get("name"):
        metadata["name"] = _fit_default_name(default_name, job)
    if req.namespace:
        metadata["namespace"] = req.namespace
    if req.wait_for_master:
        _wait_for_master(job, req)
    if req.tensorboard is not None:
        _add_tensorboard(job, req)
    _apply_labels(job, req, run_labels)
    configmap = _apply_script(job, req, run_labels) if req.training_script else None
    if req.debug:
        # A hostfile launch's workers run only sshd, which the master's launcher needs when run by hand.
        _apply_debug(job, keep={_role_names(job, req)[1]} if req.hostfile_launch is not None else set(),
                     seconds=math.ceil(seconds("debug_timeout", req.debug_timeout) + DEBUG_POD_MARGIN_SECONDS))
    validate_job(job, origin=origin)
    main = main_task(job, req)
    names = [task.get("name") for task in job["spec"]["tasks"]]
    if main not in names:
        parameter = "main_task" if req.all_tasks else "master_task_name"
        raise JobSpecError(f"{parameter} {main!r}: the job has no such task (tasks: {', '.join(map(str, names))})")
    return JobManifests(job=job, configmap=configmap, main_task=main)


def request_hash(job: dict, configmap: dict | None) -> str:
    """What the Job was built from, as a hash: its spec (pods, commands, debug mode) and its script,
    the same for every try of a task instance given the same arguments (the name, which may carry a
    random suffix, and the try number are left out). A try reattaches only to a Job of the same hash."""
    spec = copy.deepcopy(job.get("spec") or {})
    for task in spec.get("tasks") or []:
        if isinstance(task, dict):
            ((task.get("template") or {}).get("metadata") or {}).get("labels", {}).pop(TRY_NUMBER_LABEL, None)
    text = json.dumps({"spec": spec, "script": (configmap or {}).get("data")}, sort_keys=True, default=str)
    name = (job.get("metadata") or {}).get("name")
    if name:
        text = text.replace(name, "<job>")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def is_debug_job(job: dict) -> bool:
    """Whether a Job's pods were built for debug mode (they sleep: nothing trains in them)."""
    return any(DEBUG_ANNOTATION in (((task.get("template") or {}).get("metadata") or {}).get("annotations") or {})
               for task in (job.get("spec") or {}).get("tasks") or [] if isinstance(task, dict))


def main_task(job: dict, req: PyTorchJobRequest) -> str:
    """The task whose pod 0 is the Job's main pod: the PyTorch master, or for any Job `main_task`,
    else the pytorch plugin's master if the Job has one, else its first task."""
    if req.main_task:
        return req.main_task
    if not req.all_tasks:
        return _role_names(job, req)[0]
    names = [task.get("name") for task in job["spec"]["tasks"]]
    master = _plugin_arg(job, "master")
    return master if master in names else names[0]


def _pod_tasks(job: dict, req: PyTorchJobRequest) -> list[dict]:
    """The tasks pod arguments and the script go to: every task for any Job, else master and workers."""
    if req.all_tasks:
        return [task for task in job["spec"].get("tasks") or [] if isinstance(task, dict)]
    return [task for name in _role_names(job, req) if (task := _find_task(job, name)) is not None]


def debug_command(seconds: int) -> list[str]:
    """A debug pod's command: shell/debug-sleep.sh, inline (the pod may not mount the script's ConfigMap)."""
    return ["/bin/sh", "-c", shell.read("debug-sleep.sh"), "airflow-volcano-debug", str(seconds)]


def _apply_debug(job: dict, keep: set[str], seconds: int) -> None:
    """Every pod (but those of the tasks in `keep`) sleeps for at most `seconds` instead of running its
    command, which it keeps in an annotation (the task log prints it, to be run by hand in
    `kubectl exec`); the rest of the pod is unchanged."""
    for task in job["spec"]["tasks"]:
        containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or []
        if not containers or task.get("name") in {TENSORBOARD_TASK, *keep}:
            continue
        container = containers[0]
        # As the process would get it (printed for the user to run by hand).
        original = [process_string(str(part)) for part in (*(container.get("command") or []),
                                                            *(container.get("args") or []))]
        metadata = task.setdefault("template", {}).setdefault("metadata", {})
        metadata.setdefault("annotations", {})[DEBUG_ANNOTATION] = json.dumps(original)
        container["command"] = debug_command(seconds)
        container.pop("args", None)


def _default_job(req: PyTorchJobRequest) -> dict:
    """The skeleton the arguments are applied to: defaults only where nothing was given."""
    master = req.master_task_name or DEFAULT_MASTER
    worker = req.worker_task_name or DEFAULT_WORKER

    def task(name: str, replicas: int) -> dict:
        return {"name": name, "replicas": replicas, "template": {
            "spec": {"containers": [{"name": name}], "restartPolicy": DEFAULT_RESTART_POLICY}}}

    tasks = [task(master, 1)]
    tasks[0]["policies"] = copy.deepcopy(DEFAULT_MASTER_POLICIES)
    workers = req.worker_replicas if req.worker_replicas is not None else 1
    if workers:
        tasks.append(task(worker, workers))
    # svc listed explicitly: MASTER_ADDR and the host files need it and only the webhook would add it otherwise.
    plugins: dict[str, list[str]] = {"pytorch": [f"--master={master}", f"--worker={worker}", f"--port={DEFAULT_PORT}"],
                                     "svc": []}
    if req.hostfile_launch is not None:
        plugins = {plugin: [] for plugin in hostfile_launch.REQUIRED_PLUGINS}
    return {
        "apiVersion": JOB_API_VERSION,
        "kind": "Job",
        "metadata": {},
        "spec": {
            "schedulerName": DEFAULT_SCHEDULER,
            "queue": DEFAULT_QUEUE,
            "minAvailable": 1 + workers,  # gang: DDP cannot start until every rank is up
            "maxRetry": DEFAULT_MAX_RETRY,
            "plugins": plugins,
            "policies": exit_code_policies(DEFAULT_RETRYABLE_EXIT_CODES, "job"),
            "tasks": tasks,
        },
    }


def _plugin_arg(job: dict, flag: str) -> str | None:
    for arg in ((job.get("spec") or {}).get("plugins") or {}).get("pytorch") or []:
        if str(arg).startswith(f"--{flag}="):
            return str(arg).split("=", 1)[1]
    return None


def _role_names(job: dict, req: PyTorchJobRequest) -> tuple[str, str]:
    master = req.master_task_name or _plugin_arg(job, "master") or DEFAULT_MASTER
    worker = req.worker_task_name or _plugin_arg(job, "worker") or DEFAULT_WORKER
    return master, worker


def _find_task(job: dict, name: str) -> dict | None:
    tasks = (job.get("spec") or {}).get("tasks") or []
    return next((task for task in tasks if isinstance(task, dict) and task.get("name") == name), None)


def _set(target: dict, key: str, value: Any) -> None:
    """Set an explicitly given value; an empty one removes the key (no nulls or empty lists)."""
    if value is None:
        return
    if value in ([], {}, ""):
        target.pop(key, None)
    else:
        target[key] = copy.deepcopy(value)


def _apply_arguments(job: dict, req: PyTorchJobRequest) -> None:
    spec = job.setdefault("spec", {})
    master, worker = _role_names(job, req)
    for key, value in (("queue", req.queue), ("schedulerName", req.scheduler_name), ("maxRetry", req.max_retry),
                       ("ttlSecondsAfterFinished", req.ttl_seconds_after_finished),
                       ("priorityClassName", req.priority_class_name), ("policies", req.policies)):
        _set(spec, key, value)
    for plugin, plugin_args in (req.extra_plugins or {}).items():
        spec.setdefault("plugins", {})[plugin] = list(plugin_args)
    if req.hostfile_launch is not None:
        for plugin in hostfile_launch.REQUIRED_PLUGINS:
            spec.setdefault("plugins", {}).setdefault(plugin, [])
    elif req.master_task_name or req.worker_task_name or req.port is not None or req.wait_for_master:
        _rewrite_pytorch_plugin(spec, master, worker, req.port)
    master_task, worker_task = _find_task(job, master), _find_task(job, worker)
    if req.worker_replicas is not None:
        worker_task = _set_worker_replicas(job, worker_task, worker, req.worker_replicas)
    if req.master_policies is not None and master_task is not None:
        _set(master_task, "policies", req.master_policies)
    shared = _resources(_argument("resources"), req.resources)
    if req.all_tasks:
        for task in _pod_tasks(job, req):
            _apply_pod_arguments(task, req, shared)
    else:
        for task, role in ((master_task, "master_resources"), (worker_task, "worker_resources")):
            if task is not None:
                _apply_pod_arguments(task, req, _merge_resources(shared, _resources(role, getattr(req, role))))
    if req.min_available is not None:
        spec["minAvailable"] = req.min_available
    elif req.job_template is None:
        spec["minAvailable"] = sum(task.get("replicas", 0) for task in spec.get("tasks") or [])


def _rewrite_pytorch_plugin(spec: dict, master: str, worker: str, port: int | None) -> None:
    """Replace --master/--worker/--port, keep any other flag (e.g. --wait-master-enabled)."""
    plugins = spec.setdefault("plugins", {})
    current = [str(arg) for arg in plugins.get("pytorch") or []]
    if port is None:
        port = next((arg.split("=", 1)[1] for arg in current if arg.startswith("--port=")), DEFAULT_PORT)
    others = [arg for arg in current if not arg.startswith(("--master=", "--worker=", "--port="))]
    plugins["pytorch"] = [f"--master={master}", f"--worker={worker}", f"--port={port}", *others]


WAIT_MASTER_FLAGS = ("--wait-master-enabled", "--wait-master-timeout=", "--wait-master-image=")


def _wait_for_master(job: dict, req: PyTorchJobRequest) -> None:
    """Volcano's own option (pytorch plugin, v1.14+): an init container in each worker waits until
    the master accepts connections on MASTER_PORT (`nc -z`, for up to 300 s, then the pod fails).
    Its image needs sh and nc: Volcano's default busybox, or the image named by wait_for_master."""
    plugin = job["spec"]["plugins"]["pytorch"]
    plugin[:] = [arg for arg in plugin if not arg.startswith(WAIT_MASTER_FLAGS)]
    plugin += ["--wait-master-enabled", "--wait-master-timeout=300"]
    if isinstance(req.wait_for_master, str):
        plugin.append(f"--wait-master-image={req.wait_for_master}")


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


def _apply_pod_arguments(task: dict, req: PyTorchJobRequest, resources: dict) -> None:
    pod = task.setdefault("template", {}).setdefault("spec", {})
    containers = pod.setdefault("containers", [])
    if not containers:
        containers.append({"name": task.get("name", "main")})
    container = containers[0]
    command = [container_string(part) for part in req.command] if req.command is not None else None
    args = [container_string(part) for part in req.args] if req.args is not None else None
    for key, value in (("image", req.image), ("imagePullPolicy", req.image_pull_policy), ("command", command),
                       ("args", args), ("env", req.env), ("resources", resources or None),
                       ("volumeMounts", req.volume_mounts)):
        _set(container, key, value)
    secrets = [{"name": str(secret)} for secret in req.image_pull_secrets] if req.image_pull_secrets is not None \
        else None
    for key, value in (("restartPolicy", req.restart_policy), ("nodeSelector", req.node_selector),
                       ("tolerations", req.tolerations), ("volumes", req.volumes),
                       ("serviceAccountName", req.service_account_name), ("imagePullSecrets", secrets),
                       ("priorityClassName", req.priority_class_name)):
        _set(pod, key, value)


def _fit_default_name(default_name: str, job: dict) -> str:
    """The caller sized the default for its task names; a template's may be longer: shorten, keep the suffix."""
    limit = _name_limit(job)
    if limit is None or len(default_name) <= limit or "-" not in default_name:
        return default_name
    base, suffix = default_name.rsplit("-", 1)
    return default_job_name(base, "", suffix=suffix, max_len=limit)


def _apply_labels(job: dict, req: PyTorchJobRequest, labels: dict[str, str]) -> None:
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


def _apply_script(job: dict, req: PyTorchJobRequest, labels: dict[str, str]) -> dict:
    """Ship the script as a ConfigMap, mount it read-only into master and workers, run it."""
    script = req.training_script
    assert script is not None
    name = script_configmap_name(job["metadata"]["name"])
    data = {script.filename: script.content}
    worker_name = _role_names(job, req)[1]
    if req.hostfile_launch is not None:
        launch_scripts = _hostfile_launch_data(job, req.hostfile_launch, worker_name)
        if script.filename in launch_scripts:
            raise JobSpecError(f"training_script: the file name {script.filename!r} is one of the operator's own "
                               "launch scripts; rename the script")
        data.update(launch_scripts)
    for task in _pod_tasks(job, req):
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
        if req.hostfile_launch is not None and task_name == worker_name:
            container.pop("args", None)  # the script's arguments reach the ranks through the master's launcher
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


def _script_command(job: dict, req: PyTorchJobRequest, script: TrainingScript, task: str, worker: str) -> list[str]:
    path = f"{SCRIPT_MOUNT_PATH}/{script.filename}"
    if req.hostfile_launch is not None:
        return (hostfile_launch.worker_command(SCRIPT_MOUNT_PATH) if task == worker else
                hostfile_launch.master_command(req.hostfile_launch, path, SCRIPT_MOUNT_PATH))
    return torchrun_command(job, req, path) if req.launcher == "torchrun" else ["python", path]


def _hostfile_launch_data(job: dict, options: HostfileLaunch, worker: str) -> dict[str, str]:
    """The master's launch script, the workers' sshd scripts and the argv shim, beside the training script."""
    worker_task = _find_task(job, worker)
    if worker_task is None or not worker_task.get("replicas"):
        raise JobSpecError(f"launcher={options.launcher!r} runs the ranks on the workers: the job needs a task "
                           f"{worker!r} with worker_replicas >= 1")
    plugins = job["spec"].get("plugins") or {}
    missing = [plugin for plugin in ("ssh", "svc") if plugin not in plugins]
    if missing:
        raise JobSpecError(f"launcher={options.launcher!r} needs the Volcano plugins ssh and svc; the job lacks "
                           f"{', '.join(missing)} (job_template spec.plugins)")
    return hostfile_launch.scripts()


def _add_tensorboard(job: dict, req: PyTorchJobRequest) -> None:
    """A one-pod TensorBoard task reading the master's log volume, outside the gang and the ranks:
    the pytorch plugin counts only master and workers in WORLD_SIZE (Volcano >= 1.12)."""
    options = req.tensorboard or {}
    master_name = main_task(job, req)
    master = _find_task(job, master_name)
    if master is None:
        raise JobSpecError(f"tensorboard: the job has no master task {master_name!r} whose volume to read")
    if _find_task(job, TENSORBOARD_TASK) is not None:
        raise JobSpecError(f"tensorboard: the job already has a task named {TENSORBOARD_TASK!r}")
    pod = (master.get("template") or {}).get("spec") or {}
    container = (pod.get("containers") or [{}])[0]
    logdir = options["logdir"]
    mounts = [mount for mount in container.get("volumeMounts") or []
              if logdir == mount.get("mountPath", "").rstrip("/") or
              logdir.startswith(mount.get("mountPath", "").rstrip("/") + "/")]
    if not mounts:
        paths = ", ".join(repr(mount.get("mountPath")) for mount in container.get("volumeMounts") or []) or "none"
        raise JobSpecError(f"tensorboard: logdir {logdir!r} is not inside a volume mounted in the master (mounts: "
                           f"{paths}); TensorBoard runs in a pod of its own and reads the event files from a shared "
                           "volume: add one with volumes= and volume_mounts= (a PersistentVolumeClaim, NFS, or a "
                           "hostPath on a single node)")
    mount = max(mounts, key=lambda item: len(item.get("mountPath", "")))
    volume = next((item for item in pod.get("volumes") or [] if item.get("name") == mount.get("name")), None)
    if volume is None or "emptyDir" in volume:
        kind = "an emptyDir, private to each pod" if volume else "not among the master's volumes"
        raise JobSpecError(f"tensorboard: logdir {logdir!r} is on volume {mount.get('name')!r}, which is {kind}; "
                           "TensorBoard needs a volume the master shares (a PersistentVolumeClaim, NFS, hostPath)")
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
    task = _find_task(job, TENSORBOARD_TASK)
    if task is None:
        return None
    containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or [{}]
    ports = [port.get("containerPort") for port in containers[0].get("ports") or []
             if port.get("name") == TENSORBOARD_TASK]
    return f"{job['metadata']['name']}-{TENSORBOARD_TASK}-0", int(ports[0] if ports else TENSORBOARD_PORT)


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
        pods += [(f"{job['metadata']['name']}-{name}-{index}", containers[0].get("name"))
                 for index in range(int(task.get("replicas") or 0))]
    return pods


# -- validation --------------------------------------------------------------------------------------


def _name_limit(job: dict) -> int | None:
    """Longest Job name that keeps every `<job>-<task>-<last index>` within 63 characters."""
    limits = [max_job_name_length([task["name"]], task["replicas"] - 1)
              for task in (job.get("spec") or {}).get("tasks") or []
              if isinstance(task, dict) and isinstance(task.get("name"), str) and isinstance(task.get("replicas"), int)]
    return min(limits) if limits else None


def validate_job(job: dict, *, origin: str = "job") -> None:
    """What Volcano's admission webhook would reject, and what would break PyTorch ranks.

    `origin` ("job_template", "full_job_spec") prefixes errors about fields only the template sets.
    """
    if not isinstance(job, dict) or job.get("apiVersion") != JOB_API_VERSION or job.get("kind") != "Job":
        got = (job.get("apiVersion"), job.get("kind")) if isinstance(job, dict) else job
        raise JobSpecError(f"{origin}: must be apiVersion {JOB_API_VERSION}, kind Job; got {got!r}")
    spec = job.get("spec") or {}
    tasks = spec.get("tasks") or []
    if not isinstance(tasks, list) or not tasks:
        raise JobSpecError(f"{origin}: spec.tasks must list at least one task, got {tasks!r}")
    master = _plugin_arg(job, "master") or DEFAULT_MASTER
    worker = _plugin_arg(job, "worker") or DEFAULT_WORKER
    role_param = {master: "master_task_name", worker: "worker_task_name"}
    seen: dict[str, int] = {}
    total = 0
    for index, task in enumerate(tasks):
        path = f"spec.tasks[{index}]"
        if not isinstance(task, dict):
            raise JobSpecError(f"{origin}: {path} must be a mapping, got {task!r}")
        name = task.get("name")
        if not isinstance(name, str) or not DNS_LABEL.match(name) or len(name) > 63:
            raise JobSpecError(f"{origin}: {path}.name {name!r} is not a DNS label (lowercase letters, digits, '-')")
        if name in seen:
            raise JobSpecError(f"duplicate task name {name!r} (spec.tasks[{seen[name]}] and {path}): "
                               "master_task_name/worker_task_name must differ")
        seen[name] = index
        replicas = _integer(f"{origin}: {path}.replicas", task.get("replicas", 0), allow_str=False)
        total += replicas
        if task.get("minAvailable") is not None:
            task_min = _integer(f"{origin}: {path}.minAvailable", task["minAvailable"], allow_str=False)
            if task_min > replicas:
                raise JobSpecError(f"{origin}: {path}.minAvailable ({task_min}) is larger than its replicas "
                                   f"({replicas})")
        _validate_policies(f"{origin}: {path}.policies", task.get("policies"))
        _validate_pod(f"{path}.template.spec", name, (task.get("template") or {}).get("spec") or {})
    _validate_policies(f"{origin}: spec.policies", spec.get("policies"))
    _validate_plugins(spec, seen, tasks, role_param)
    if spec.get("minAvailable") is not None:
        min_available = _integer("min_available", spec["minAvailable"], allow_str=False)
        if min_available > total:
            raise JobSpecError(f"min_available ({min_available}) is larger than the total replicas ({total})")
    for key, parameter in (("maxRetry", "max_retry"), ("ttlSecondsAfterFinished", "ttl_seconds_after_finished")):
        if spec.get(key) is not None:
            _integer(parameter, spec[key], allow_str=False)
    for key, parameter in (("queue", "volcano_queue"), ("schedulerName", "scheduler_name"),
                           ("priorityClassName", "priority_class_name")):
        if key in spec and (not isinstance(spec[key], str) or not spec[key]):
            raise JobSpecError(f"{parameter} must be a non-empty string, got {spec[key]!r}")
    _validate_name(job)
    for labels in [(job.get("metadata") or {}).get("labels")] + [
            ((task.get("template") or {}).get("metadata") or {}).get("labels") for task in tasks]:
        for key, value in (labels or {}).items():
            _check_label("labels", str(key), str(value))


def _validate_name(job: dict) -> None:
    name = (job.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not JOB_NAME.match(name):
        raise JobSpecError(f"name {name!r} is not a DNS label (lowercase letters, digits and '-', starting with a "
                           "letter, ending with a letter or digit)")
    limit = _name_limit(job)
    if limit is not None and len(name) > limit:
        raise JobSpecError(f"name {name!r} is {len(name)} characters; at most {limit} keep every pod name "
                           f"<job>-<task>-<index> within {POD_NAME_MAX} characters (the pod hostname)")


def _check_key(parameter: str, key: str) -> None:
    """A label, annotation or node-selector key: an optional DNS-subdomain prefix and a name."""
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not LABEL_PREFIX_PART.match(prefix))) or not LABEL_NAME.match(name) \
            or len(name) > 63:
        raise JobSpecError(f"{parameter}: invalid key {key!r} (an optional DNS prefix and '/', then <= 63 "
                           "characters of [A-Za-z0-9._-], starting and ending alphanumeric)")


def _check_not_reserved(parameter: str, keys: Iterable[Any] | None) -> None:
    """Labels and annotations the provider sets itself (a user's `airflow-volcano.io/checked` would make
    every retry ignore its Job and train again): refused in arguments and templates."""
    for key in keys or ():
        if str(key).startswith(LABEL_PREFIX) or str(key) == MANAGED_BY_LABEL:
            raise JobSpecError(f"{parameter}: {str(key)!r} is reserved for airflow-volcano's own bookkeeping "
                               f"(keys {LABEL_PREFIX}* and {MANAGED_BY_LABEL}); choose another key")


def _check_template_keys(job: dict, origin: str) -> None:
    """A template's labels and annotations, of the Job and of each pod template, are not ours."""
    metadatas = [("metadata", job.get("metadata"))] + [
        (f"spec.tasks[{index}].template.metadata", (task.get("template") or {}).get("metadata"))
        for index, task in enumerate((job.get("spec") or {}).get("tasks") or []) if isinstance(task, dict)]
    for path, metadata in metadatas:
        if isinstance(metadata, dict):
            for kind in ("labels", "annotations"):
                if isinstance(metadata.get(kind), dict):
                    _check_not_reserved(f"{origin} {path}.{kind}", metadata[kind])


def _check_label(parameter: str, key: str, value: str) -> None:
    _check_key(parameter, key)
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise JobSpecError(f"{parameter}: invalid label value {value!r} for key {key!r} (<= 63 characters of "
                           "[A-Za-z0-9._-], starting and ending alphanumeric)")


def _validate_pod(path: str, task: str, pod: dict) -> None:
    containers = pod.get("containers") or []
    if not isinstance(containers, list) or not containers:
        raise JobSpecError(f"image: task {task!r} has no containers ({path}.containers)")
    for index, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("image"), str) \
                or not container["image"].strip():
            got = container.get("image") if isinstance(container, dict) else container
            name = container.get("name") if isinstance(container, dict) else None
            raise JobSpecError(f"image: task {task!r} container {name!r} has no image, got {got!r} "
                               f"({path}.containers[{index}].image)")
        if container.get("env") is not None:
            if not isinstance(container["env"], list):
                raise JobSpecError(f"env must be a list of EnvVar dicts, got {container['env']!r} ({path}.env)")
            _env_list(container["env"])
    if pod.get("restartPolicy") is not None and pod["restartPolicy"] not in RESTART_POLICIES:
        raise JobSpecError(f"restart_policy must be one of {', '.join(sorted(RESTART_POLICIES))}; got "
                           f"{pod['restartPolicy']!r} ({path}.restartPolicy)")


def _validate_policies(parameter: str, policies: Any) -> None:
    """Volcano's webhook rules: event(s) xor exitCode, known names, no duplicates, `*` alone."""
    if policies is None:
        return
    if not isinstance(policies, list):
        raise JobSpecError(f"{parameter} must be a list of policies, got {policies!r}")
    seen_events: set[str] = set()
    seen_codes: set[int] = set()
    for policy in policies:
        if not isinstance(policy, dict):
            raise JobSpecError(f"{parameter}: a policy must be a mapping, got {policy!r}")
        extra = policy.get("events") or []
        if not isinstance(extra, list):
            raise JobSpecError(f"{parameter}: events must be a list, got {extra!r}")
        events = list(dict.fromkeys(([policy["event"]] if policy.get("event") else []) + extra))
        exit_code = policy.get("exitCode")
        if events and exit_code is not None:
            raise JobSpecError(f"{parameter}: policy {policy!r} has both an event and exitCode; give one")
        if not events and exit_code is None:
            raise JobSpecError(f"{parameter}: policy {policy!r} needs an event, events or an exitCode")
        if exit_code is not None:
            if isinstance(exit_code, bool) or not isinstance(exit_code, int) or exit_code == 0:
                raise JobSpecError(f"{parameter}: exitCode must be a non-zero integer, got {exit_code!r}")
            if exit_code in seen_codes:
                raise JobSpecError(f"{parameter}: duplicate exitCode {exit_code!r}")
            seen_codes.add(exit_code)
        for event in events:
            if event not in EVENTS:
                raise JobSpecError(f"{parameter}: unknown event {event!r} (one of {', '.join(sorted(EVENTS))})")
            if event in seen_events:
                raise JobSpecError(f"{parameter}: duplicate event {event!r} (it appears in more than one policy)")
            seen_events.add(event)
        if policy.get("action") not in ACTIONS:
            raise JobSpecError(f"{parameter}: unknown action {policy.get('action')!r} "
                               f"(one of {', '.join(sorted(ACTIONS))})")
    if "*" in seen_events and len(seen_events) > 1:
        raise JobSpecError(f"{parameter}: event '*' must be the only event, got {sorted(seen_events)!r}")


def _validate_plugins(spec: dict, seen: dict[str, int], tasks: list[dict], role_param: dict[str, str]) -> None:
    plugins = spec.get("plugins") or {}
    if not isinstance(plugins, dict):
        raise JobSpecError(f"extra_plugins: spec.plugins must be a mapping, got {plugins!r}")
    for plugin, plugin_args in plugins.items():
        if plugin not in PLUGINS:
            raise JobSpecError(f"extra_plugins: unknown Volcano plugin {plugin!r} "
                               f"(one of {', '.join(sorted(PLUGINS))})")
        if plugin_args is not None and (not isinstance(plugin_args, list) or
                                        not all(isinstance(arg, str) for arg in plugin_args)):
            raise JobSpecError(f"extra_plugins: arguments of plugin {plugin!r} must be a list of strings, "
                               f"got {plugin_args!r}")
    if "pytorch" not in plugins:
        return
    job = {"spec": spec}
    master = _plugin_arg(job, "master") or DEFAULT_MASTER
    worker = _plugin_arg(job, "worker") or DEFAULT_WORKER
    port = _plugin_arg(job, "port")
    if port is not None:
        _integer("port", port, 1, 65535)
    if master not in seen:
        raise JobSpecError(f"{role_param[master]} {master!r}: the job has no such task (tasks: {', '.join(seen)})")
    master_replicas = tasks[seen[master]].get("replicas", 0)
    if master_replicas != 1:
        raise JobSpecError(f"the master task {master!r} must have exactly 1 replica, got {master_replicas} "
                           f"(spec.tasks[{seen[master]}].replicas): the pytorch plugin gives rank 0 to "
                           f"{master}-0 and the ranks break otherwise")
    if worker not in seen and len([name for name in seen if name != TENSORBOARD_TASK]) > 1:
        raise JobSpecError(f"{role_param[worker]} {worker!r}: the job has no such task (tasks: {', '.join(seen)})")
