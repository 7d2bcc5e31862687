"""Checks of values before anything is submitted, each error naming the parameter and the bad value:
the generic ones the request's arguments use (integers, durations, types, labels, env, resources),
and `validate_job`, what Volcano's admission webhook would reject in a whole Job and what would break
its ranks."""

from __future__ import annotations

import copy
import datetime
import json
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

import yaml

from airflow_volcano.constants import JOB_API_VERSION, LABEL_PREFIX, MANAGED_BY_LABEL, MIN_STALL_TIMEOUT
from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.kubelet import ExpandVars
from airflow_volcano.manifest.names import (
    DEFAULT_MASTER,
    DEFAULT_WORKER,
    DNS_LABEL,
    JOB_NAME,
    LABEL_NAME,
    LABEL_PREFIX_PART,
    LABEL_VALUE,
    POD_NAME_MAX,
    TENSORBOARD_TASK,
    name_limit,
    plugin_arg,
)
from airflow_volcano.manifest.policies import validate_policies

ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
CONFIGMAP_KEY = re.compile(r"^[-._a-zA-Z0-9]+\Z")


# Unprefixed container resources Kubernetes knows; anything else needs a domain (nvidia.com/gpu).
STANDARD_RESOURCES = {"cpu", "memory", "ephemeral-storage"}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?\Z")
QUANTITY_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")  # its number part


SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
PLUGINS = {"pytorch", "svc", "env", "ssh", "mpi", "tensorflow", "ray", "hcclrank"}


RESTART_POLICIES = {"Always", "OnFailure", "Never"}
PULL_POLICIES = {"Always", "IfNotPresent", "Never"}


def integer(parameter: str, value: Any, minimum: int = 0, maximum: int | None = None, why: str = "",
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


def stall_seconds(parameter: str, value: Any) -> float | None:
    """stall_timeout: seconds (a number) or a timedelta, at least MIN_STALL_TIMEOUT; None: off. A value
    below it is refused naming the unit: a DAG written when it took minutes (`stall_timeout=10`) fails
    here rather than waiting ten seconds, or hours."""
    if value is None:
        return None
    number = value.total_seconds() if isinstance(value, datetime.timedelta) else value
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number) or (
            number < MIN_STALL_TIMEOUT):
        raise JobSpecError(f"{parameter} must be a number of seconds >= {MIN_STALL_TIMEOUT:g} or a timedelta of at "
                           f"least {MIN_STALL_TIMEOUT:g} seconds, got {value!r} (it takes seconds, not minutes: "
                           f"{MIN_STALL_TIMEOUT:g} or more, e.g. 600 for ten minutes)")
    return float(number)


def optional_seconds(parameter: str, value: Any) -> float | None:
    """As `seconds`, or None: that limit is off."""
    return None if value is None else seconds(parameter, value)


def check_type(parameter: str, value: Any, kind: type, item: type | tuple[type, ...] | None = None) -> None:
    if value is None:
        return
    if not isinstance(value, kind):
        raise JobSpecError(f"{parameter} must be a {kind.__name__}, got {value!r}")
    items = item if isinstance(item, tuple) else (item,) if item is not None else ()
    if items and any(not isinstance(element, items) or isinstance(element, bool) for element in value):  # type: ignore[attr-defined]
        names = " or ".join(kind.__name__ for kind in items)
        raise JobSpecError(f"{parameter} must be a {kind.__name__} of {names}, got {value!r}")


def choice(parameter: str, value: str | None, allowed: set[str]) -> None:
    if value is not None and value not in allowed:
        raise JobSpecError(f"{parameter} must be one of {', '.join(sorted(allowed))}; got {value!r}")


def check_key(parameter: str, key: str) -> None:
    """A label, annotation or node-selector key: an optional DNS-subdomain prefix and a name."""
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not LABEL_PREFIX_PART.match(prefix))) or not LABEL_NAME.match(name) \
            or len(name) > 63:
        raise JobSpecError(f"{parameter}: invalid key {key!r} (an optional DNS prefix and '/', then <= 63 "
                           "characters of [A-Za-z0-9._-], starting and ending alphanumeric)")


def check_label(parameter: str, key: str, value: str) -> None:
    check_key(parameter, key)
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise JobSpecError(f"{parameter}: invalid label value {value!r} for key {key!r} (<= 63 characters of "
                           "[A-Za-z0-9._-], starting and ending alphanumeric)")


def check_not_reserved(parameter: str, keys: Iterable[Any] | None) -> None:
    """Labels and annotations the provider sets itself (a user's `airflow-volcano.io/checked` would make
    every retry ignore its Job and train again): refused in arguments and templates."""
    for key in keys or ():
        if str(key).startswith(LABEL_PREFIX) or str(key) == MANAGED_BY_LABEL:
            raise JobSpecError(f"{parameter}: {str(key)!r} is reserved for airflow-volcano's own bookkeeping "
                               f"(keys {LABEL_PREFIX}* and {MANAGED_BY_LABEL}); choose another key")


def check_template_keys(job: dict, origin: str) -> None:
    """A template's labels and annotations, of the Job and of each pod template, are not ours."""
    metadatas = [("metadata", job.get("metadata"))] + [
        (f"spec.tasks[{index}].template.metadata", (task.get("template") or {}).get("metadata"))
        for index, task in enumerate((job.get("spec") or {}).get("tasks") or []) if isinstance(task, dict)]
    for path, metadata in metadatas:
        if isinstance(metadata, dict):
            for kind in ("labels", "annotations"):
                if isinstance(metadata.get(kind), dict):
                    check_not_reserved(f"{origin} {path}.{kind}", metadata[kind])


def env_list(env: Any) -> list[dict]:
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
    names = [str(item["name"]) for item in items]
    if duplicates := sorted({name for name in names if names.count(name) > 1}):
        raise JobSpecError(f"env: each variable once; given more than once: {', '.join(map(repr, duplicates))}")
    return items


def check_shell_env_names(parameter: str, env: list[dict]) -> None:
    """A hostfile launch's ranks get their pod's environment through a shell (the ssh session
    restores it), which cannot carry names such as `MY-VAR` or `my.var`: refuse them, not lose them."""
    for item in env:
        if not SHELL_NAME.match(str(item.get("name", ""))):
            raise JobSpecError(f"{parameter}: {item.get('name')!r} cannot reach the ranks of a DeepSpeed/mpirun "
                               "launch, which get the pod's environment through a shell: use letters, digits and "
                               "'_', not starting with a digit")


def resource_requirements(parameter: str, spec: Any) -> dict[str, dict[str, str]]:
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
        parts = {key: quantities(f"{parameter}.{key}", value) for key, value in spec.items()}
    else:
        both = quantities(parameter, spec)
        parts = {"requests": dict(both), "limits": dict(both)}
    requirements = {key: value for key, value in parts.items() if value}
    requests_within_limits(parameter, requirements)
    return requirements


QUANTITY_SUFFIXES = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
                     "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
                     "P": Decimal("1e15"), "E": Decimal("1e18"),
                     **{f"{prefix}i": Decimal(1024) ** (power + 1) for power, prefix in enumerate("KMGTPE")}}


def quantity_value(quantity: str) -> Decimal:
    """A quantity QUANTITY matched, as a number (2Gi -> 2147483648, 500m -> 0.5, 1e3 -> 1000)."""
    number = QUANTITY_NUMBER.match(quantity)
    assert number is not None
    return Decimal(number[0]) * QUANTITY_SUFFIXES[quantity[number.end():]]


def requests_within_limits(parameter: str, requirements: dict[str, dict[str, str]]) -> None:
    """Kubernetes (and Volcano's webhook, which checks the pod template) refuses a request above its limit."""
    limits = requirements.get("limits") or {}
    for name, request in (requirements.get("requests") or {}).items():
        if name in limits and quantity_value(request) > quantity_value(limits[name]):
            raise JobSpecError(f"{parameter}: the request of {name} ({request}) is more than its limit "
                               f"({limits[name]}); a request may not exceed its limit")


def quantities(parameter: str, spec: Any) -> dict[str, str]:
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


def merge_resources(shared: dict, role: dict) -> dict:
    merged = {key: dict(value) for key, value in shared.items()}
    for key, value in role.items():
        merged.setdefault(key, {}).update(value)
    return merged


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


def validate_job(job: dict, *, origin: str = "job", parameters: Mapping[str, str] | None = None) -> None:
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
    master = plugin_arg(job, "master") or DEFAULT_MASTER
    worker = plugin_arg(job, "worker") or DEFAULT_WORKER
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
        replicas = integer(f"{origin}: {path}.replicas", task.get("replicas", 0), allow_str=False)
        total += replicas
        if task.get("minAvailable") is not None:
            task_min = integer(f"{origin}: {path}.minAvailable", task["minAvailable"], allow_str=False)
            if task_min > replicas:
                raise JobSpecError(f"{origin}: {path}.minAvailable ({task_min}) is larger than its replicas "
                                   f"({replicas})")
        validate_policies(f"{origin}: {path}.policies", task.get("policies"))
        _validate_pod(f"{path}.template.spec", name, (task.get("template") or {}).get("spec") or {})
    validate_policies(f"{origin}: spec.policies", spec.get("policies"))
    _validate_plugins(spec, seen, tasks, role_param)
    if spec.get("minAvailable") is not None:
        min_available = integer("min_available", spec["minAvailable"], allow_str=False)
        if min_available > total:
            raise JobSpecError(f"min_available ({min_available}) is larger than the total replicas ({total})")
    # A template's value of a field an argument sets is named by that argument (`parameters`: key -> argument).
    named = dict(parameters or {})
    for key in ("maxRetry", "ttlSecondsAfterFinished"):
        if spec.get(key) is not None:
            integer(named.get(key, f"{origin}: spec.{key}"), spec[key], allow_str=False)
    for key in ("queue", "schedulerName", "priorityClassName"):
        if key in spec and (not isinstance(spec[key], str) or not spec[key]):
            raise JobSpecError(f"{named.get(key, f'{origin}: spec.{key}')} must be a non-empty string, got "
                               f"{spec[key]!r}")
    _validate_name(job)
    for labels in [(job.get("metadata") or {}).get("labels")] + [
            ((task.get("template") or {}).get("metadata") or {}).get("labels") for task in tasks]:
        for key, value in (labels or {}).items():
            check_label("labels", str(key), str(value))


def _validate_name(job: dict) -> None:
    name = (job.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not JOB_NAME.match(name):
        raise JobSpecError(f"name {name!r} is not a DNS label (lowercase letters, digits and '-', starting with a "
                           "letter, ending with a letter or digit)")
    limit = name_limit(job)
    if limit is not None and len(name) > limit:
        raise JobSpecError(f"name {name!r} is {len(name)} characters; at most {limit} keep every pod name "
                           f"<job>-<task>-<index> within {POD_NAME_MAX} characters (the pod hostname)")


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
        _check_mounts(path, task, pod, container, index)
        if container.get("env") is not None:
            if not isinstance(container["env"], list):
                raise JobSpecError(f"env must be a list of EnvVar dicts, got {container['env']!r} ({path}.env)")
            env_list(container["env"])
    if pod.get("restartPolicy") is not None and pod["restartPolicy"] not in RESTART_POLICIES:
        raise JobSpecError(f"restart_policy must be one of {', '.join(sorted(RESTART_POLICIES))}; got "
                           f"{pod['restartPolicy']!r} ({path}.restartPolicy)")


def _check_mounts(path: str, task: str, pod: dict, container: dict, index: int) -> None:
    """Every volumeMount names a volume of its pod (the webhook refuses the Job otherwise)."""
    volumes = [volume.get("name") for volume in pod.get("volumes") or [] if isinstance(volume, dict)]
    for mount in container.get("volumeMounts") or []:
        if isinstance(mount, dict) and mount.get("name") not in volumes:
            known = ", ".join(map(repr, volumes)) or "none"
            raise JobSpecError(f"volume_mounts: mount {mount.get('name')!r} at {mount.get('mountPath')!r} in task "
                               f"{task!r} names no volume of its pod (volumes: {known}); add it with volumes= "
                               f"({path}.containers[{index}].volumeMounts)")


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
    master = plugin_arg(job, "master") or DEFAULT_MASTER
    worker = plugin_arg(job, "worker") or DEFAULT_WORKER
    port = plugin_arg(job, "port")
    if port is not None:
        integer("port", port, 1, 65535)
    if master not in seen:
        raise JobSpecError(f"{role_param[master]} {master!r}: the job has no such task (tasks: {', '.join(seen)})")
    master_replicas = tasks[seen[master]].get("replicas", 0)
    if master_replicas != 1:
        raise JobSpecError(f"the master task {master!r} must have exactly 1 replica, got {master_replicas} "
                           f"(spec.tasks[{seen[master]}].replicas): the pytorch plugin gives rank 0 to "
                           f"{master}-0 and the ranks break otherwise")
    if worker not in seen and len([name for name in seen if name != TENSORBOARD_TASK]) > 1:
        raise JobSpecError(f"{role_param[worker]} {worker!r}: the job has no such task (tasks: {', '.join(seen)})")
