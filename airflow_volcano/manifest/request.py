"""The one request every operator builds from its arguments (`JobRequest`), and its checks.

An argument is declared once, as a field of `JobRequest` named like the operator's argument, with
the check that validates (and, for templated numbers, converts) it; `normalize` runs those checks and
the rules that relate arguments to each other, before anything is built or submitted. Every error
names the parameter and the bad value. `None` means "not given": an explicit argument overrides
`job_template`, which overrides the built-in defaults.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from airflow_volcano.constants import DEFAULT_DEBUG_TIMEOUT, DEFAULT_SHM_SIZE
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.hostfile_launch import HostfileLaunch
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


def argument(check: Check | None = None, default: Any = None, *, lands: Lands | tuple[Lands, ...] | None = None,
             templated: bool = False) -> Any:
    """A field of JobRequest: an operator argument of the same name, with the check `normalize` runs on
    it when given, its default (the operators' signatures use the same constant), where it lands in
    the Job, and whether the operators template it (their `template_fields` are derived from this)."""
    places = lands if isinstance(lands, tuple) else (lands,) if lands is not None else ()
    return field(default=default, metadata={"check": check, "lands": places, "templated": templated})


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


def _pull_secrets(names: list[Any]) -> list[dict]:
    return [{"name": str(name)} for name in names]


@dataclass
class JobRequest:
    """The operators' arguments for building a Job (see the operators' docstrings and the docs' argument tables for
    each). A field is an operator argument of the same name; `kind` says which Job it builds."""

    kind: JobKind = JobKind.PYTORCH
    # -- the Job ------------------------------------------------------------------------------------
    name: str | None = argument(_text, templated=True)
    namespace: str | None = argument(_dns_label, templated=True)
    job_template: dict | None = argument(_mapping, templated=True)  # parsed by the operator (a file or text)
    full_job_spec: dict | None = argument(_mapping, templated=True)
    main_task: str | None = argument(_dns_label, templated=True)  # GENERIC: the task whose pod 0 is followed
    labels: dict[str, str] | None = argument(_labels, templated=True)
    annotations: dict[str, str] | None = argument(_annotations, templated=True)
    priority_class_name: str | None = argument(_text, templated=True, lands=(Lands("job", "priorityClassName"),
                                                                            Lands("pod", "priorityClassName")))
    volcano_queue: str | None = argument(_text, templated=True, lands=Lands("job", "queue"))
    scheduler_name: str | None = argument(_text, lands=Lands("job", "schedulerName"))
    # Volcano's webhook treats 0 as "unset" and substitutes a default: refuse it rather than surprise.
    min_available: int | str | None = argument(_integer(1, None, " (Volcano's webhook turns 0 into all replicas)"),
                                               templated=True)
    max_retry: int | str | None = argument(_integer(1, None, " (Volcano's webhook turns 0 into 3)"),
                                           lands=Lands("job", "maxRetry"))
    ttl_seconds_after_finished: int | str | None = argument(_integer(0), lands=Lands("job", "ttlSecondsAfterFinished"))
    policies: list[dict] | None = argument(_policies, lands=Lands("job", "policies"))
    retryable_exit_codes: list[int] | None = argument()  # checked with restart_scope, as they build policies
    restart_scope: str | None = argument(_one_of(set(RESTART_SCOPES)))
    extra_plugins: dict[str, list[str]] | None = argument(_plugins)
    tensorboard: dict[str, Any] | None = argument(_tensorboard, templated=True)
    # -- the pods -----------------------------------------------------------------------------------
    image: str | None = argument(_text, templated=True, lands=Lands("container", "image"))
    command: list[str] | None = argument(_list_of(str, int, float, ExpandVars), templated=True,
                                         lands=Lands("container", "command", _container_strings))
    args: list[str] | None = argument(_list_of(str, int, float, ExpandVars), templated=True,
                                      lands=Lands("container", "args", _container_strings))
    env: list[dict] | dict[str, Any] | None = argument(_env, templated=True, lands=Lands("container", "env"))
    container_resources: dict | None = argument(_resources, templated=True)
    node_selector: dict[str, str] | None = argument(_labels, templated=True, lands=Lands("pod", "nodeSelector"))
    tolerations: list[dict] | None = argument(_list_of(dict), templated=True, lands=Lands("pod", "tolerations"))
    volumes: list[dict] | None = argument(_list_of(dict), templated=True, lands=Lands("pod", "volumes"))
    volume_mounts: list[dict] | None = argument(_list_of(dict), templated=True,
                                                lands=Lands("container", "volumeMounts"))
    service_account_name: str | None = argument(_text, templated=True, lands=Lands("pod", "serviceAccountName"))
    image_pull_policy: str | None = argument(_one_of(PULL_POLICIES), lands=Lands("container", "imagePullPolicy"))
    image_pull_secrets: list[str] | None = argument(_list_of(str, int, float),
                                                    lands=Lands("pod", "imagePullSecrets", _pull_secrets))
    restart_policy: str | None = argument(_one_of(RESTART_POLICIES), lands=Lands("pod", "restartPolicy"))
    training_script: TrainingScript | None = argument(_script, templated=True)  # read by the operator
    debug: bool | None = argument()
    debug_timeout: float | str = argument(seconds, DEFAULT_DEBUG_TIMEOUT)  # seconds the debug pods may live
    # None turns it off (unlike the other fields, whose None means "not given").
    shm_size: str | None = argument(_quantity, DEFAULT_SHM_SIZE)
    termination_grace_period: int | str | None = argument(_integer(0))
    checkpoint_dir: str | None = argument(_absolute_path, templated=True)
    # Also the wait's (WaitLimits, with stall_action); in the pods it adds what prints the Python stacks.
    stall_timeout: float | None = argument(stall_seconds)  # seconds (or a timedelta), seconds once checked
    # -- master and workers (PYTORCH, HOSTFILE) ------------------------------------------------------
    worker_replicas: int | str | None = argument(_integer(0), templated=True)
    master_task_name: str | None = argument(_dns_label)
    worker_task_name: str | None = argument(_dns_label)
    master_resources: dict | None = argument(_resources, templated=True)
    worker_resources: dict | None = argument(_resources, templated=True)
    master_policies: list[dict] | None = argument(_policies)
    port: int | str | None = argument(_integer(1, 65535))
    launcher: str | None = argument()  # checked by kind: python/torchrun, or deepspeed/mpirun
    # -- PYTORCH ------------------------------------------------------------------------------------
    nproc_per_node: int | str | None = argument(templated=True)  # an int or torchrun's names: checked with the launcher
    max_restarts: int | str | None = argument(_integer(0))
    torchrun_options: list[str] | None = argument(templated=True)  # checked with the launcher
    wait_for_master: bool | str | None = argument(_wait_for_master)
    # -- HOSTFILE -----------------------------------------------------------------------------------
    slots_per_worker: int | str | None = argument(_integer(1), templated=True)
    launcher_options: list[str] | None = argument(templated=True)  # checked with the launcher
    ssh_wait_timeout: int | str | None = argument(_integer(1))
    # Not an argument: the checked launch of a HOSTFILE Job, set by `normalize`.
    hostfile_launch: HostfileLaunch | None = field(default=None, metadata={"check": None, "derived": True})


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
