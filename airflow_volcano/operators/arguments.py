"""The operators' own arguments (those the Job is not built from), declared like JobRequest's, and what
is generated from every declaration: the operators' `__init__` signatures and their `:param` lines, and the
TaskFlow decorators' typed signatures (`@task.volcano_pytorch` takes what its operator class takes).

They are written into the source by `python -m airflow_volcano.operators.arguments` (and
tests/unit/test_argument_declarations.py fails when they are not current), so that IDEs and type
checkers see every argument of every operator and decorator with its type, and `inspect.signature` and `__doc__`
show them at run time. An argument a class takes is one of its `argument_groups`' and not one of its
`refused_arguments`; its `template_fields` are its templated arguments (`templated_fields`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum, StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_volcano.compat import conf
from airflow_volcano.constants import (
    DEFAULT_CONN_ID,
    DEFAULT_IMAGE_PULL_TIMEOUT,
    DEFAULT_NODE_LOST_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_STARTUP_TIMEOUT,
    IfJobExists,
    OnFinishAction,
    OnKillAction,
    StallAction,
)
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.manifest.api_form import api_form
from airflow_volcano.manifest.request import Check, JobRequest, argument, template_or_integer

if TYPE_CHECKING:
    from airflow.sdk import Asset

DEFAULT_DEFERRABLE = conf.getboolean("operators", "default_deferrable", fallback=False)


def _folders(parameter: str, value: Iterable[str] | None) -> list[str] | None:
    """Absolute folders, checked at DAG parse (the argument is not templated, by design)."""
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(item, str) and os.path.isabs(item) for item in value):
        raise JobSpecError(f"{parameter} must be a list of absolute folder paths, got {value!r}")
    return list(value)


def _one_of(allowed: type[StrEnum]) -> Check:
    def check(parameter: str, value: Any) -> str:
        if value not in set(allowed):
            raise JobSpecError(f"{parameter} must be one of {', '.join(allowed)}; got {value!r}")
        return str(value)

    return check


# KubernetesPodOperator's argument names for what these operators call otherwise: passed here, Airflow
# would refuse them as unknown arguments without a word on the name to use.
KUBERNETES_POD_OPERATOR_NAMES = {
    "env_vars": "env",
    "cmds": "command",
    "arguments": "args",
    "startup_timeout_seconds": "startup_timeout",
    "schedulername": "scheduler_name",
    "in_cluster": "kubernetes_conn_id (a Kubernetes connection with in_cluster set)",
    "config_file": "kubernetes_conn_id (a Kubernetes connection with kube_config_path)",
    "cluster_context": "kubernetes_conn_id (a Kubernetes connection with cluster_context)",
}
# The keys of Airflow's own `resources` (BaseOperator: the executor's resources, airflow.sdk Resources).
EXECUTOR_RESOURCE_KEYS = {"cpus", "ram", "disk", "gpus"}


def refuse_kubernetes_pod_operator_habits(operator: str, kwargs: dict[str, Any]) -> None:
    """A clear error for KubernetesPodOperator's names, and for pod resources given as Airflow's
    `resources` (which BaseOperator takes for the executor: its own error names neither)."""
    for name, ours in KUBERNETES_POD_OPERATOR_NAMES.items():
        if name in kwargs:
            raise JobSpecError(f"{operator} takes no {name}= (KubernetesPodOperator's name): use {ours}; "
                               f"got {name}={kwargs[name]!r}")
    resources = api_form(kwargs.get("resources"))
    if isinstance(resources, dict) and set(resources) - EXECUTOR_RESOURCE_KEYS:
        raise JobSpecError(f"resources is Airflow's executor resources ({', '.join(sorted(EXECUTOR_RESOURCE_KEYS))}"
                           f"); the pods' are container_resources (or master_resources/worker_resources): got "
                           f"resources={resources!r}")


@dataclass
class OperatorArguments:
    """The arguments of every operator that are not the Job's (how it is waited for, logged, kept or
    deleted), declared as JobRequest's are. A check here runs when the operator is constructed (at the
    DAG's parse), on every value; the durations are checked before submitting (WaitLimits.checked)."""

    allowed_file_dirs: Sequence[str] | None = argument(
        _folders,
        doc="more absolute folders `training_script` and `job_template` may be read from, besides the DAG file's "
            "folder, the DAG's `template_searchpath` and those every task of the deployment may read from: "
            "`[volcano] allowed_file_dirs` (comma-separated; docker compose: `VOLCANO_ALLOWED_FILE_DIRS`) and the "
            "connection's extra `allowed_file_dirs` (a list or comma-separated). Not templated on purpose: a value "
            "rendered from a DAG run's `params` can never name a file outside the folders the DAG author chose "
            "(`scripts/{{ params.s }}` with `s=../../home/airflow/.kube/config` is refused, naming the "
            "parameter).")
    kubernetes_conn_id: str = argument(
        default=DEFAULT_CONN_ID, templated=True, doc="the cncf-kubernetes `kubernetes` connection.")
    get_logs: bool = argument(
        default=True,
        doc="stream the main pod's log (a PyTorch Job's master's) into the task log, each line shown at the time "
            "the pod printed it.")
    log_tasks: list[str] | None = argument(
        templated=True,
        doc='names of more Volcano tasks (e.g. `["worker"]`) whose every pod\'s log is copied into the task log '
            "as it is written, each line prefixed `[<pod>]` like the main pod's, in both modes (deferred: copied "
            "with the main pod's). A pod Volcano removed before a copy reached it, such as a worker still running "
            "when the master's completion ended the Job, has no log left to read: the task log says so. A name "
            "the Job has no task for fails before submitting.")
    startup_timeout: float | datetime.timedelta | None = argument(
        default=DEFAULT_STARTUP_TIMEOUT,
        doc="seconds or a timedelta (default 900; `None`: no limit) the gang may take to first run, counted from "
            "the Job's creation on the apiserver's clock (never the worker's or the triggerer's, which may be "
            "skewed); past it, the task fails with the scheduler's reason. After a restart (a retryable exit, an "
            "eviction, a lost node, `stall_action=\"restart\"`) the restarted gang gets the same bound again, "
            "counted from when the waiter saw the restart. Pods outside the gang (a TensorBoard, replicas above "
            "`min_available`) never end the Job: the task log says they wait and why.")
    image_pull_timeout: float | datetime.timedelta | None = argument(
        default=DEFAULT_IMAGE_PULL_TIMEOUT,
        doc="seconds or a timedelta (default 300; `None`: only `startup_timeout` bounds it) a pod the gang needs "
            "may stay in an image pull back-off that may pass (the registry's 429 or 5xx, a registry out of "
            "reach: the kubelet retries by itself), counted from when the waiter first saw it; the task log says "
            "so meanwhile. An image the kubelet says cannot exist or cannot be read (not found, manifest unknown, "
            "unauthorized, denied, an invalid name, `imagePullPolicy: Never` without the image) fails the task at "
            "once, naming the image.")
    job_timeout: float | datetime.timedelta | None = argument(
        doc="seconds or a timedelta: a client-side deadline (Volcano has none), counted from the Job's creation "
            "on the apiserver's clock; past it, the Job is deleted and the task fails.")
    node_lost_timeout: float | datetime.timedelta | None = argument(
        default=DEFAULT_NODE_LOST_TIMEOUT,
        doc="seconds or a timedelta (default 180; `None` turns the check off) the pods of a node that stopped "
            "answering may stay lost, counted by the waiter from when it first saw them lost, before they are "
            "deleted and handled like an eviction: the Job restarts under `max_retry`, or the task fails naming "
            "the node. Never before the cluster's own eviction has begun: a pod is deleted only once the taint "
            "manager has evicted it (its toleration of `node.kubernetes.io/unreachable` ran out: 300 s unless "
            "the pod says otherwise, see `tolerations`); a pod that tolerates the taint without limit is never "
            "deleted (the task waits for the node). Only the Job's own pods, each exactly as it was seen (its "
            "uid), never a pod waiting for a readiness gate. Needs `delete` on pods (deploy/rbac.yaml).")
    stall_action: str = argument(
        default=StallAction.FAIL,
        doc="what a stall (`stall_timeout`) does. `fail` (default): the Job is deleted and the task fails with "
            "\"stalled: no output for N seconds\" (or minutes) and where each process was. `restart`: a gang "
            "restart: the Job's Running training pods are deleted gracefully, each by its uid, and the Job's "
            "`PodEvicted` policy restarts the gang, counted in `max_retry` (a Job whose policies do not restart on "
            "`PodEvicted` is refused before submitting); the stall's clock then starts again. At most 3 times, "
            "and a restart that is refused (no `delete` on pods) fails the task as `fail` would, saying why. "
            "`restart` needs `delete` on pods (deploy/rbac.yaml).")
    on_finish_action: str = argument(
        _one_of(OnFinishAction), OnFinishAction.DELETE_SUCCEEDED_JOB,
        doc="`delete_job`, `delete_succeeded_job` (default: failed Jobs are kept for debugging) or `keep_job`. "
            "T9k's `Unfinished` (delete the pods still running, keep finished ones for their logs) is what a kept "
            "Job already is: Volcano's end (Completed, Terminated, Failed, Aborted) deletes the pods still running "
            "and keeps finished ones (tested on the real node: after success the workers are gone and the "
            "master's log is still readable). A Job the task ends itself (`job_timeout`, a stall, pods that cannot "
            "start, a spent restart budget) is deleted whatever it says.")
    on_kill_action: str = argument(
        _one_of(OnKillAction), OnKillAction.DELETE_JOB,
        doc="what killing the task does to the Job: `delete_job` (default) or `keep_job`. A worker stopping, or "
            "`execution_timeout`, while the task has a try left keeps the Job for that try to reattach to.")
    if_job_exists: str = argument(
        _one_of(IfJobExists), IfJobExists.REATTACH,
        doc="what to do with a Job an earlier try of this task instance submitted and no try has reported "
            "(still running, or finished since): `reattach` (default: wait for it instead of submitting another), "
            "`fail` (fail the task, leaving the Job as it is) or `replace` (delete it and submit anew). A Job "
            "built from other arguments, script or debug mode than this try's fails the task unless `replace` (a "
            "sleeping debug Job is replaced).")
    delete_orphaned_jobs: bool = argument(
        default=True,
        doc="before submitting, sweep the namespace for Jobs no try will watch again: another task instance's, "
            "which Airflow reports finished (a worker killed outright, then the task marked failed or success), "
            "not kept on purpose (`on_finish_action`, `on_kill_action`). Each is marked at first sight and "
            "deleted by a submission five minutes later or more. Default True.")
    deferrable: bool = argument(
        default=DEFAULT_DEFERRABLE, default_source="DEFAULT_DEFERRABLE",
        doc="wait in the triggerer instead of a worker slot (default `[operators] default_deferrable`).")
    poll_interval: float | datetime.timedelta = argument(
        default=DEFAULT_POLL_INTERVAL,
        doc="seconds or a timedelta (default 5): how often the pods are looked at while the Job has not started "
            "(less often for a Job that waits long, at most once a minute).")
    model_asset: Asset | str | None = argument(  # made an Asset (lineage.as_asset) as the operator is constructed
        doc="an Airflow `Asset` (or its URI) the training produces, added to the task's `outlets`. Every "
            "successful run emits an event of each Asset in `outlets`, whose `extra` holds what a consumer needs: "
            "the `model_uri` and metrics the main pod's termination message reports, the Volcano Job, the image "
            "and its digest, the Airflow run, where the time went (`goodput`; docs \"Retraining pipelines\"). A "
            "failed run emits nothing.")


@dataclass(frozen=True)
class Declared:
    """One argument as a class takes it: its declaration, with the class's default and doc text."""

    name: str
    annotation: str  # as the signatures write it
    default: Any
    doc: str
    templated: bool
    group: str  # the class's group it belongs to
    check: Check | None
    in_request: bool  # a JobRequest field (checked by `normalize`); else checked at construction
    number: bool
    default_source: str | None = None

    def at_construction(self, value: Any) -> Any:
        """The value as the operator keeps it: Kubernetes client models (`k8s.V1EnvVar`, ...) in the API's
        form; an operator argument's check; a templated integer given as text must be a Jinja template (or
        digits)."""
        value = api_form(value)
        if self.number:
            template_or_integer(self.name, value)
        return value if self.in_request or self.check is None else self.check(self.name, value)


def declarations() -> list[dataclasses.Field]:
    """Every argument's one declaration: JobRequest's fields, then OperatorArguments'."""
    return [item for request_type in (JobRequest, OperatorArguments) for item in dataclasses.fields(request_type)
            if "doc" in item.metadata]


@functools.cache
def operator_arguments(operator: type) -> tuple[Declared, ...]:
    """The arguments `operator` takes, grouped in the order of its `argument_groups`, each group in
    declaration order."""
    groups: tuple[str, ...] = operator.argument_groups  # type: ignore[attr-defined]
    refused = set(operator.refused_arguments)  # type: ignore[attr-defined]
    taken: list[tuple[int, Declared]] = []
    request_fields = {field.name for field in dataclasses.fields(JobRequest)}
    for order, item in enumerate(declarations()):
        meta = item.metadata
        mine = [group for group in groups if group in meta["groups"]]
        if not mine or item.name in refused:
            continue
        variant = next((meta["variants"][group] for group in reversed(mine) if group in meta["variants"]), None)
        taken.append((groups.index(mine[-1]) * 1000 + order, Declared(
            name=item.name, annotation=meta["accepts"] or str(item.type),
            default=variant.default if variant else meta["default"], doc=variant.doc if variant else meta["doc"],
            templated=meta["templated"], group=mine[-1], check=meta["check"],
            in_request=item.name in request_fields,
            number=meta["number"], default_source=None if variant else meta["default_source"])))
    return tuple(declared for _, declared in sorted(taken, key=lambda pair: pair[0]))


def own_arguments(operator: type) -> list[Declared]:
    """The arguments `operator` adds to its bases': those of its last group (its `:param` lines)."""
    return [declared for declared in operator_arguments(operator) if declared.group == operator.argument_groups[-1]]  # type: ignore[attr-defined]


# -- taking them ------------------------------------------------------------------------------------------


def templated_fields(operator: type) -> tuple[str, ...]:
    """An operator class's template_fields: the two manifests first (the UI shows the Job before
    anything else), then every templated argument it takes (its declarations), in order;
    `extra_template_fields` of its own added. Derived, never sliced, so a subclass cannot lose a base
    class's field."""
    names = [declared.name for declared in operator_arguments(operator) if declared.templated]
    return ("job_manifest", "script_manifest", *names, *getattr(operator, "extra_template_fields", ()))


def take_arguments(operator: object, declared_in: type, given: dict[str, Any]) -> None:
    """Each argument `declared_in` adds to its base's, checked as the operator is constructed, as the
    attribute of the same name (Airflow renders template fields from the attributes). `given` is the
    signature's `locals()`."""
    base = declared_in.__mro__[1]
    # The first class with declarations (VolcanoJobOperator) inherits none: its base is BaseOperator.
    inherited = {declared.name for declared in operator_arguments(base)} if hasattr(base, "argument_groups") \
        else set()
    for declared in operator_arguments(declared_in):
        if declared.name not in inherited:
            setattr(operator, declared.name, declared.at_construction(given[declared.name]))


def passed_on(declared_in: type, given: dict[str, Any]) -> dict[str, Any]:
    """The arguments of `given` (a signature's `locals()`) that `declared_in`'s base takes."""
    return {declared.name: given[declared.name] for declared in operator_arguments(declared_in.__mro__[1])
            if declared.name in given}


@functools.cache
def request_arguments(operator: type) -> tuple[str, ...]:
    """The JobRequest fields an operator class takes as arguments and passes on as they are (the files
    and debug mode are converted: operators/building.py)."""
    converted = {"debug", "training_script", "job_template"}
    return tuple(sorted(declared.name for declared in operator_arguments(operator)
                        if declared.in_request and declared.name not in converted))


# -- generated source --------------------------------------------------------------------------------------


def _code(declared: Declared) -> str:
    value = declared.default
    if declared.default_source:
        return declared.default_source
    if isinstance(value, Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, str):
        return json.dumps(value)  # double-quoted, as the code around it
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    raise TypeError(f"{declared.name}: a default of type {type(value).__name__} needs a default_source")


GENERATED = "# Generated from the declarations: python -m airflow_volcano.operators.arguments"


def _parameter_lines(operator: type, indent: str) -> list[str]:
    """The generated part of a signature: every argument `operator` takes, typed, with its default."""
    return [f"{indent}{GENERATED}", *(f"{indent}{declared.name}: {declared.annotation} = {_code(declared)},"
                                      for declared in operator_arguments(operator))]


def signature_lines(operator: type) -> list[str]:
    """`operator`'s `def __init__(...) -> None:`, every argument it takes keyword-only and typed."""
    return ["    def __init__(", "        self,", "        *,", *_parameter_lines(operator, " " * 8),
            "        **kwargs: Any,", "    ) -> None:"]


def param_lines(operator: type) -> list[str]:
    """The `:param` lines of `operator`'s docstring: those of the arguments it adds to its bases'."""
    return [line for declared in own_arguments(operator)
            for line in textwrap.wrap(f":param {declared.name}: {declared.doc}", width=116, initial_indent="    ",
                                      subsequent_indent="        ", break_long_words=False, break_on_hyphens=False)]


def regenerated(source: str, operator: type) -> str:
    """`source` (the module of `operator`) with the class's `:param` lines (from its docstring's first one to
    its end) and its `__init__` signature written from the declarations."""
    lines = source.split("\n")
    start = lines.index(next(line for line in lines if line.startswith(f"class {operator.__name__}(")))
    first_param = next(index for index in range(start, len(lines)) if lines[index].startswith("    :param "))
    doc_end = lines.index('    """', first_param)
    lines[first_param:doc_end] = param_lines(operator)
    init = lines.index("    def __init__(", start)
    init_end = lines.index("    ) -> None:", init)
    lines[init:init_end + 1] = signature_lines(operator)
    return "\n".join(lines)


def regenerated_decorator(source: str, function: str, operator: type) -> str:
    """`source` (a decorator's module) with the generated part of `function`'s first signature (its typed
    overload, up to its `**kwargs: Any,`) written from `operator`'s arguments: a TaskFlow decorator takes what
    the operator class it builds takes."""
    lines = source.split("\n")
    start = lines.index(f"def {function}(")
    first = lines.index(f"    {GENERATED}", start)
    end = lines.index("    **kwargs: Any,", first)
    lines[first:end] = _parameter_lines(operator, " " * 4)
    return "\n".join(lines)


def generated_decorators() -> list[tuple[Callable[..., Any], type]]:
    """The TaskFlow decorators whose typed signature is generated here, each with the operator class it builds."""
    from airflow_volcano.decorators.volcano_pytorch import _VolcanoPyTorchDecoratedOperator, volcano_pytorch_task

    return [(volcano_pytorch_task, _VolcanoPyTorchDecoratedOperator)]


def generated_classes() -> list[type]:
    """The operator classes whose source is generated here."""
    from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
    from airflow_volcano.operators.job import VolcanoJobOperator
    from airflow_volcano.operators.master_worker import MasterWorkerJobOperator
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    return [VolcanoJobOperator, MasterWorkerJobOperator, VolcanoPyTorchJobOperator, VolcanoDeepSpeedJobOperator]


def source_file(operator: type) -> Path:
    import sys

    return Path(str(sys.modules[operator.__module__].__file__))


def regenerate() -> None:
    """Rewrite the operators' and decorators' generated source after a declaration changed."""
    for operator in generated_classes():
        path = source_file(operator)
        path.write_text(regenerated(path.read_text(), operator))
        print(f"{path}: {operator.__name__}")
    for function, operator in generated_decorators():
        path = source_file(operator)
        path.write_text(regenerated_decorator(path.read_text(), function.__name__, operator))
        print(f"{path}: {function.__name__}")


if __name__ == "__main__":
    from airflow_volcano.operators import arguments  # the module the operators use, not this __main__ copy

    arguments.regenerate()
