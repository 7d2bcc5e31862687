"""Links from the task in the Airflow UI to the Job, the master's log and TensorBoard.

Each URL comes from a template in the provider's config (`[volcano] job_url_template`, ...) or in
the connection's extras (same names; the connection wins), filled with the Job's values:
`{namespace}`, `{name}`, `{uid}`, `{pod}` (the master pod) and `{container}`, and for TensorBoard
`{tensorboard_pod}` and `{tensorboard_port}` (no TensorBoard task, no link). The operator stores
the URL in XCom when it submits or reattaches, where the UI reads it, so rendering a link never
calls the cluster. No template, no link. `publish` stores them, with the Job's identity, as soon as the
Job exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import structlog
from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.job_ref import JobRef

# Airflow's task-time logger, as an operator's own `self.log` is: its lines are the task log's.
log = structlog.get_logger(f"airflow.task.{__name__}")


_UNKNOWN = object()


class _VolcanoLink(BaseOperatorLink):
    """The URL is in XCom under `xcom_key`, where Airflow's UI reads it (Airflow 3 serializes a
    link as its name and XCom key); get_link reads the same value from a running task."""

    template_option: ClassVar[str]
    # A field the Job must have for the link to exist (TensorBoard's only if the Job runs one).
    requires: ClassVar[str | None] = None

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # A running operator knows its links once it knows its Job (None before: a task that failed
        # before submitting has none, and asking XCom would log "XCom not found" for each link).
        urls: Any = getattr(operator, "_link_urls", _UNKNOWN)
        if urls is not _UNKNOWN:
            return str((urls or {}).get(self.xcom_key, ""))
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(ti_key=ti_key, key=self.xcom_key) or ""


class VolcanoJobLink(_VolcanoLink):
    """The Job in a dashboard (Volcano's dashboard, or any that takes namespace and name)."""

    name = "Volcano dashboard"
    template_option = "job_url_template"


class MasterLogLink(_VolcanoLink):
    """The master pod's log in a log viewer (Kubernetes Dashboard, Grafana/Loki, ...)."""

    name = "Master pod log"
    template_option = "pod_log_url_template"


class TensorBoardLink(_VolcanoLink):
    """The TensorBoard the `tensorboard=` argument adds to the Job (an ingress, the apiserver's
    pod proxy, or a port-forward's localhost address)."""

    name = "TensorBoard"
    template_option = "tensorboard_url_template"
    requires = "tensorboard_pod"


LINKS: tuple[_VolcanoLink, ...] = (VolcanoJobLink(), MasterLogLink(), TensorBoardLink())


def link_urls(templates: dict[str, str | None], values: dict[str, Any]) -> dict[str, str]:
    """Every link's URL by XCom key, from its template: "" (no button) for a link without a template,
    or whose template names an unknown field (skipped with a warning naming the option and field).
    Every key gets a value, so that Airflow, reading each link's XCom when the task ends, finds one
    (a missing XCom logs an error there)."""
    urls = {link.xcom_key: "" for link in LINKS}
    for link in LINKS:
        template = templates.get(link.template_option)
        if not template or (link.requires and not values.get(link.requires)):
            continue
        try:
            urls[link.xcom_key] = template.format(**values)
        except (KeyError, IndexError, ValueError) as error:
            log.warning("[volcano] %s %r cannot be filled (%s); known fields: %s", link.template_option, template,
                        error, ", ".join(sorted(values)))
    return urls


def job_link_urls(connection_extra: Callable[[str], Any], ref: JobRef, job: dict) -> dict[str, str]:
    """The UI links' URLs for this Job: each template from the connection's extra (`connection_extra`
    reads it), else `[volcano]`, filled with the Job's values."""
    from airflow_volcano.compat import conf
    from airflow_volcano.manifest import tensorboard_endpoint

    templates = {link.template_option: connection_extra(link.template_option)
                 or conf.get("volcano", link.template_option, fallback="") for link in LINKS}
    values: dict[str, Any] = {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid or "",
                              "pod": ref.main_pod, "container": ref.main_pod_container}
    if (endpoint := tensorboard_endpoint(job)) is not None:
        values["tensorboard_pod"], values["tensorboard_port"] = endpoint
    return link_urls(templates, values)


def publish(ti: Any, hook: VolcanoHook, ref: JobRef, job: dict, kubernetes_conn_id: str, say: Any) -> dict[str, str]:
    """What a task says of its Job as soon as it exists: its identity in XCom (for downstream tasks and the
    sensor), the TensorBoard port-forward in the task log (`say`), and the UI links' URLs in XCom, where
    the UI reads them; returns the URLs (the operator's `_link_urls`)."""
    from airflow_volcano.manifest import tensorboard_endpoint

    # main_pod: the pod whose log is followed and whose termination message is the result (the
    # master's, for PyTorch and DeepSpeed); master_pod is its former name, kept for one release.
    for key, value in (("job_name", ref.name), ("namespace", ref.namespace), ("main_pod", ref.main_pod),
                       ("master_pod", ref.main_pod), ("main_task", ref.main_task),
                       ("kubernetes_conn_id", kubernetes_conn_id)):
        ti.xcom_push(key=key, value=value)
    if (endpoint := tensorboard_endpoint(job)) is not None:
        say("TensorBoard of this Job: kubectl port-forward -n %s pod/%s %d, then http://localhost:%d",
            ref.namespace, endpoint[0], endpoint[1], endpoint[1])
    urls = job_link_urls(hook.connection_extra, ref, job)
    for key, url in urls.items():
        ti.xcom_push(key=key, value=url)
    return urls


def links_by_name(urls: dict[str, str] | None) -> dict[str, str]:
    """The links that have a URL, by the name the UI shows (for the failure report)."""
    return {link.name: url for link in LINKS if (url := (urls or {}).get(link.xcom_key))}
