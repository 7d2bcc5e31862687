"""Secrets in what the provider shows and stores: the rendered manifests (UI), `dry_run()`, the task log,
what a trigger copies and fires, the panel, the XComs it pushes, asset event extras, lineage facets.

Airflow masks a rendered field that is a dict by its keys, but `job_manifest` and `script_manifest`
are YAML text: a literal `env={"HF_TOKEN": "hf_..."}` would show as it is. So every env value whose
name Airflow would hide (token, password, secret, api_key, ... and the names of
`[core] sensitive_var_conn_names`) is shown as `***` in them and registered with Airflow's secrets
masker, which then hides it wherever it appears in the task log (a script printing it, an error).
Values Airflow already knows are secret (a Variable or a connection's password used in a template)
are masked in the shown text by the same masker.

Those values are known to the worker's masker only (it rendered the templates): a triggerer, the API
server's panel and a resumed worker never read the Variable. So the worker writes where they sit in the
Job, never what they are, into its annotation `MASKED_ANNOTATION` (JSON: `[pointer, start, end]` of one
occurrence of each, an RFC 6901 pointer to a string and its characters as the process gets them), and
whoever reads the Job reads them back from the Job itself (`secret_values`): nothing secret travels in
trigger arguments, XCom or the metadata DB (Airflow 3 stores a deferred task's trigger arguments as
plain JSON, and 3.1 and 3.2 return them through the REST API), and no key has to be shared. Whoever can
read the annotation can read the Job's arguments in clear anyway.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import yaml

from airflow_volcano.constants import LABEL_PREFIX, RETRY_BUDGET_ANNOTATION
from airflow_volcano.kubelet import process_string
from airflow_volcano.manifest.pod_runtime import SHOWN_ENV_VALUES, shown_command

REDACTED = "***"
# Where in the Job the values Airflow's masker knew as secret sit (see above): the provider's own.
MASKED_ANNOTATION = f"{LABEL_PREFIX}masked"
# At most this many values are read back from an annotation (one per distinct value: a forged or huge
# annotation costs bounded work in a triggerer that reads every Job of a namespace).
MAX_MASKED_PLACES = 256
# The strings of a container the kubelet expands `$(VAR)` and `$$` in (kubelet.process_string).
_PROCESSED_FIELDS = frozenset({"command", "args"})


def _containers(job: dict) -> Iterator[dict]:
    for task in (job.get("spec") or {}).get("tasks") or []:
        pod = ((task.get("template") or {}).get("spec") or {}) if isinstance(task, dict) else {}
        for key in ("initContainers", "containers"):
            yield from (container for container in pod.get(key) or [] if isinstance(container, dict))


def secret_env(job: dict) -> list[dict]:
    """The env entries of every container of the Job whose names say they hold a secret."""
    from airflow.sdk._shared.secrets_masker import should_hide_value_for_key

    return [item for container in _containers(job) for item in container.get("env") or []
            if isinstance(item, dict) and isinstance(item.get("value"), str) and item["value"]
            and should_hide_value_for_key(str(item.get("name", "")))]


def register_secrets(job: dict) -> None:
    """Tell Airflow's masker (of this task process and its supervisor) the Job's secret values, as the
    process gets them, so that the task log hides them: its secret env values, and the values at its
    `MASKED_ANNOTATION` places (a resumed worker learns them from the Job)."""
    from airflow.sdk.log import mask_secret

    for item in secret_env(job):
        mask_secret(process_string(item["value"]), str(item["name"]))
    for _pointer, value in masked_values(job):
        mask_secret(value)


def secret_values(job: dict) -> tuple[tuple[str, str], ...]:
    """(name, value) of the Job's secret values, as the processes get them: its secret env values, and
    (named by their pointer) the values at its `MASKED_ANNOTATION` places."""
    return (*((str(item["name"]), process_string(item["value"])) for item in secret_env(job)),
            *masked_values(job))


@functools.cache
def _masker_getter() -> Callable[[], Any] | None:
    try:
        from airflow.sdk._shared.secrets_masker import _secrets_masker
    except ImportError:
        return None
    return _secrets_masker


def _process_masker() -> Any | None:
    """Airflow's secrets masker of this process: the Task SDK's, which the task runner's Variable and
    Connection reads and `mask_secret` feed (airflow-core, when installed, has a masker of its own). None
    where this Airflow has none there (it is not public API)."""
    getter = _masker_getter()
    return getter() if getter is not None else None


def process_redact(text: str) -> str:
    """`text` with every value this process's Airflow masker knows masked (values only: a name-based
    redaction would turn a result's `tokens_per_second` into `***`)."""
    replacer = getattr(_process_masker(), "replacer", None)
    return replacer.sub(REDACTED, text) if replacer is not None and text else text


def _kubelet_processed(path: tuple[str | int, ...]) -> bool:
    """Whether the string at `path` of a Job is a container's command, args or env value."""
    return len(path) >= 9 and path[:2] == ("spec", "tasks") and path[3:5] == ("template", "spec") and \
        path[5] in ("containers", "initContainers") and (
            (len(path) == 9 and path[7] in _PROCESSED_FIELDS) or (len(path) == 10 and path[7] == "env"
                                                                  and path[9] == "value"))


def _strings(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every string of a Job with its path, as its reader gets it (a container's as the process does)."""
    if isinstance(value, str):
        yield path, process_string(value) if _kubelet_processed(path) else value
    elif isinstance(value, dict):
        for key, item in value.items():
            if path + (str(key),) != ("metadata", "annotations", MASKED_ANNOTATION):
                yield from _strings(item, path + (str(key),))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, path + (index,))


def _pointer(path: tuple[str | int, ...]) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _at(job: Any, pointer: str) -> str | None:
    """The string at `pointer` of the Job as its reader gets it; None if there is none."""
    if not pointer.startswith("/"):
        return None
    path: list[str | int] = []
    value = job
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and part in value:
            value = value[part]
            path.append(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
            path.append(int(part))
        else:
            return None
    if not isinstance(value, str):
        return None
    return process_string(value) if _kubelet_processed(tuple(path)) else value


def mark_masked_places(job: dict) -> int | None:
    """Annotate the Job with where its strings hold a value this process's Airflow masker knows as secret
    (a Variable or a connection field rendered into it): one place per value, never the value. Returns
    how many values; None when Airflow's masker cannot be read (nothing is annotated then)."""
    annotations = job.setdefault("metadata", {}).setdefault("annotations", {})
    annotations.pop(MASKED_ANNOTATION, None)
    masker = _process_masker()
    if masker is None or not hasattr(masker, "replacer"):
        return None
    if masker.replacer is None:
        return 0
    places: dict[str, list[Any]] = {}
    for path, text in _strings(job):
        for match in masker.replacer.finditer(text):
            if match.group() and match.group() not in places:
                places[match.group()] = [_pointer(path), match.start(), match.end()]
    if places:
        annotations[MASKED_ANNOTATION] = json.dumps(list(places.values())[:MAX_MASKED_PLACES],
                                                    separators=(",", ":"))
    return len(places)


def masked_values(job: Any) -> tuple[tuple[str, str], ...]:
    """(pointer, value) of the values at the Job's `MASKED_ANNOTATION` places; a place that is not there
    (or an annotation that does not parse) is left out."""
    annotation = (((job or {}).get("metadata") or {}).get("annotations") or {}).get(MASKED_ANNOTATION)
    try:
        places = json.loads(annotation) if isinstance(annotation, str) else []
    except ValueError:
        return ()
    found: list[tuple[str, str]] = []
    for place in places[:MAX_MASKED_PLACES] if isinstance(places, list) else []:
        if not (isinstance(place, list) and len(place) == 3 and isinstance(place[0], str)
                and all(isinstance(bound, int) for bound in place[1:])):
            continue
        pointer, start, end = place
        text = _at(job, pointer)
        if text is not None and 0 <= start < end <= len(text):
            found.append((pointer, text[start:end]))
    return tuple(found)


class JobSecrets:
    """The secret values of one Job (`secret_values`: its secret env values, and the values Airflow's
    masker knew where its `MASKED_ANNOTATION` says), masking everything a trigger logs and sends (copied
    log lines, reports, its event), the panel, and what a worker pushes (XCom, asset event extras, lineage);
    the process's own Airflow masker is applied too. Nothing is registered with the process's masker: a
    triggerer's keeps every value it is told for the rest of its life and masks it in every trigger's log;
    these are known only while they are needed, and forgotten with this object."""

    def __init__(self, values: Iterable[tuple[str, str]] = ()) -> None:
        from airflow.sdk._shared.secrets_masker import SecretsMasker

        self._masker = SecretsMasker()
        self.add(values)

    @classmethod
    def of(cls, job: dict | None) -> JobSecrets:
        """The secrets of a Job as read from the apiserver (a waited view holds none of them)."""
        return cls(secret_values(job) if job else ())

    def add(self, values: Iterable[tuple[str, str]]) -> None:
        """(name, value) pairs already chosen as secret (`secret_values`): each value is masked. Not by
        name again: a masker of one's own knows no sensitive names (the process's masker reads them from
        the configuration), so it would hide nothing."""
        for _name, value in values:
            self._masker.add_mask(value)

    def redact(self, value: Any) -> Any:
        """`value` with every known secret masked in each of its strings, at any depth (the masker's own
        walk of a dict stops a few levels down, and a pod's termination message sits deeper)."""
        if isinstance(value, str):
            return process_redact(str(self._masker.redact(value)) if self._masker.patterns else value)
        if isinstance(value, dict):
            return {key: self.redact(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.redact(item) for item in value)
        return value


def shown(document: dict, *, whole: bool = False) -> dict:
    """A copy of a manifest to show (UI, dry_run): secret env values as `***`, and in every string
    the values the masker knows to be secret masked (its own walk of a dict stops a few levels deep,
    and a Job's env is deeper); the signal-forwarding shell and the files in its env named, not inlined,
    unless `whole` (dry_run: what is applied, to pipe into `kubectl apply --dry-run=server`), and without the
    restart budgets' annotation."""
    from airflow.sdk._shared.secrets_masker import redact

    def masked(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: masked(item) for key, item in value.items()}
        if isinstance(value, list):
            return [masked(item) for item in value]
        return redact(value) if isinstance(value, str) else value

    safe = masked(document)
    for item in secret_env(safe):
        item["value"] = REDACTED
    if whole:
        return safe
    # The task's bookkeeping of the restart budgets (manifest/retry_budget.py) is left out of the UI's
    # view, which Airflow cuts at max_templated_field_length: the task log and the panel say both budgets.
    annotations = (safe.get("metadata") or {}).get("annotations")
    if isinstance(annotations, dict) and annotations.pop(RETRY_BUDGET_ANNOTATION, None) is not None \
            and not annotations:
        del safe["metadata"]["annotations"]
    for task in (safe.get("spec") or {}).get("tasks") or []:
        for container in (((task or {}).get("template") or {}).get("spec") or {}).get("containers") or []:
            if isinstance(container, dict) and isinstance(container.get("command"), list):
                container["command"] = shown_command(container["command"])
            for item in (container.get("env") or []) if isinstance(container, dict) else []:
                if isinstance(item, dict) and item.get("name") in SHOWN_ENV_VALUES:
                    item["value"] = SHOWN_ENV_VALUES[item["name"]]
    return safe


def shown_yaml(*documents: dict | None, whole: bool = False) -> str:
    """The manifests as YAML to show (see `shown`)."""
    # Collections of scalars on one line each ({name: x, value: y}): a Job stays readable and within
    # Airflow's rendered-field limit (max_templated_field_length, 4,096 characters) for longer.
    return yaml.safe_dump_all([shown(doc, whole=whole) for doc in documents if doc is not None], sort_keys=False,
                              allow_unicode=True, default_flow_style=None, width=120)
