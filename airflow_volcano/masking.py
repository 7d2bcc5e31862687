"""Secrets in what the provider shows: the rendered manifests (UI), `dry_run()` and the task log.

Airflow masks a rendered field that is a dict by its keys, but `job_manifest` and `script_manifest`
are YAML text: a literal `env={"HF_TOKEN": "hf_..."}` would show as it is. So every env value whose
name Airflow would hide (token, password, secret, api_key, ... and the names of
`[core] sensitive_var_conn_names`) is shown as `***` in them and registered with Airflow's secrets
masker, which then hides it wherever it appears in the task log (a script printing it, an error).
Values Airflow already knows are secret (a Variable or a connection's password used in a template)
are masked in the shown text by the same masker.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import yaml

from airflow_volcano.kubelet import process_string
from airflow_volcano.manifest.pod_runtime import SHOWN_ENV_VALUES, shown_command

REDACTED = "***"


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
    """Tell Airflow's masker (of this task process and its supervisor) the Job's secret env values, as
    the process gets them, so that the task log hides them."""
    from airflow.sdk.log import mask_secret

    for item in secret_env(job):
        mask_secret(process_string(item["value"]), str(item["name"]))


def secret_values(job: dict) -> tuple[tuple[str, str], ...]:
    """(name, value) of the Job's secret env values, as the processes get them."""
    return tuple((str(item["name"]), process_string(item["value"])) for item in secret_env(job))


class JobSecrets:
    """The secret env values of the Job one trigger waits on, masking everything the trigger logs and
    sends (copied log lines, reports, its event). Nothing is registered with the triggerer's own
    masker, which keeps every value it is told for the rest of its life and masks it in every
    trigger's log: these are known only while the trigger waits, and forgotten with it."""

    def __init__(self) -> None:
        from airflow.sdk._shared.secrets_masker import SecretsMasker

        self._masker = SecretsMasker()

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
            return self._masker.redact(value) if self._masker.patterns else value
        if isinstance(value, dict):
            return {key: self.redact(item) for key, item in value.items()}
        if isinstance(value, list | tuple):
            return type(value)(self.redact(item) for item in value)
        return value


def shown(document: dict) -> dict:
    """A copy of a manifest to show (UI, dry_run): secret env values as `***`, and in every string
    the values the masker knows to be secret masked (its own walk of a dict stops a few levels deep,
    and a Job's env is deeper); the signal-forwarding shell and the files in its env named, not inlined."""
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
    for task in (safe.get("spec") or {}).get("tasks") or []:
        for container in (((task or {}).get("template") or {}).get("spec") or {}).get("containers") or []:
            if isinstance(container, dict) and isinstance(container.get("command"), list):
                container["command"] = shown_command(container["command"])
            for item in (container.get("env") or []) if isinstance(container, dict) else []:
                if isinstance(item, dict) and item.get("name") in SHOWN_ENV_VALUES:
                    item["value"] = SHOWN_ENV_VALUES[item["name"]]
    return safe


def shown_yaml(*documents: dict | None) -> str:
    """The manifests as YAML to show (see `shown`)."""
    # Collections of scalars on one line each ({name: x, value: y}): a Job stays readable and within
    # Airflow's rendered-field limit (max_templated_field_length, 4,096 characters) for longer.
    return yaml.safe_dump_all([shown(doc) for doc in documents if doc is not None], sort_keys=False,
                              allow_unicode=True, default_flow_style=None, width=120)
