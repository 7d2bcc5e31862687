"""What a training produced, for whoever consumes it: the model asset's event `extra`, and the
OpenLineage facets of the operators. Pure; the OpenLineage client (installed with
apache-airflow-providers-openlineage) is imported only when its listener asks for the facets.

The convention a script follows to hand over its model (the termination message, which already carries
the task's `result`): the main pod writes JSON to `/dev/termination-log` with `model_uri` (where the
model or checkpoint is) and its final metrics, as numbers at the top level or under `metrics`:

    {"model_uri": "s3://models/ranker/2026-11-26", "eval_loss": 0.031, "metrics": {"auc": 0.94}}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow.sdk import Asset

from airflow_volcano.exceptions import JobSpecError

MODEL_URI_KEY = "model_uri"


def reported_model(result: Any) -> tuple[str | None, dict[str, float]]:
    """The model URI and the metrics the main pod's termination message reports (the convention above)."""
    if not isinstance(result, Mapping):
        return None, {}
    metrics = {str(key): value for key, value in result.items()
               if isinstance(value, int | float) and not isinstance(value, bool)}
    nested = result.get("metrics")
    if isinstance(nested, Mapping):
        metrics.update({str(key): value for key, value in nested.items()
                        if isinstance(value, int | float) and not isinstance(value, bool)})
    uri = result.get(MODEL_URI_KEY)
    return (str(uri) if uri else None), metrics


def model_asset_extra(summary: Mapping[str, Any], *, uid: str | None, dag_id: str, run_id: str, task_id: str,
                      try_number: int | None) -> dict[str, Any]:
    """The `extra` of a successful run's model asset event: what a consumer needs to pick the model up
    and know what made it (JSON-able, no secret: nothing of the pods' environment)."""
    model_uri, metrics = reported_model(summary.get("result"))
    return {
        "model_uri": model_uri,
        "metrics": metrics,
        "volcano_job": {"namespace": summary.get("namespace"), "name": summary.get("job_name"), "uid": uid,
                        "phase": summary.get("phase"), "restarts": summary.get("retry_count")},
        "image": summary.get("image"),
        "image_digest": summary.get("image_digest"),
        "airflow": {"dag_id": dag_id, "run_id": run_id, "task_id": task_id, "try_number": try_number},
        "resumed_from": summary.get("resumed_from"),
        "goodput": summary.get("goodput"),
    }


def image_digest(pod: Mapping[str, Any] | None, container: str) -> tuple[str | None, str | None]:
    """The image a container ran and its digest, as the kubelet reports them (`imageID`: `...@sha256:...`,
    or `sha256:...` for an image the node built; None where it reports none)."""
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            image_id = str(status.get("imageID") or "")
            digest = image_id.rsplit("@", 1)[-1] if "sha256:" in image_id else None
            return status.get("image"), digest
    return None, None


def as_asset(value: Asset | str) -> Asset:
    """`model_asset` as an Airflow Asset (a URI string is one); a clear error for anything else."""
    if isinstance(value, Asset):
        return value
    if isinstance(value, str) and value.strip():
        try:
            return Asset(value.strip())
        except ValueError as error:  # Airflow's own check of the URI
            raise JobSpecError(f"model_asset {value!r} is not a valid asset URI: {error}") from None
    raise JobSpecError(f"model_asset must be an Asset or its URI (a string), got {value!r}")


# -- OpenLineage ----------------------------------------------------------------------------------------


def dataset_of(asset: Any) -> Any:
    """An Airflow Asset (or a URI) as an OpenLineage dataset: the URI's scheme and authority its namespace,
    its path its name."""
    from openlineage.client.event_v2 import Dataset

    uri = str(getattr(asset, "uri", asset))
    scheme, _, rest = uri.partition("://")
    if not rest:
        return Dataset(namespace="airflow-asset", name=uri)
    authority, _, path = rest.partition("/")
    return Dataset(namespace=f"{scheme}://{authority}", name=f"/{path}" if path else "/")


def job_description(job: Mapping[str, Any] | None, *, operator: str, launcher: str | None) -> dict[str, Any]:
    """The Volcano Job as the job facet `volcanoJob` describes it: its namespace and name, queue, priority
    class, the operator and launcher, and each task's replicas, image and resources. Nothing of the pods'
    environment, command or arguments (a secret may be there)."""
    spec = (job or {}).get("spec") or {}
    metadata = (job or {}).get("metadata") or {}
    tasks = {}
    for task in spec.get("tasks") or []:
        containers = ((task.get("template") or {}).get("spec") or {}).get("containers") or [{}]
        tasks[str(task.get("name"))] = {"replicas": task.get("replicas"), "image": containers[0].get("image"),
                                        "resources": containers[0].get("resources") or {}}
    return {"namespace": metadata.get("namespace"), "name": metadata.get("name") or metadata.get("generateName"),
            "queue": spec.get("queue") or "default", "priorityClass": spec.get("priorityClassName"),
            "operator": operator, "launcher": launcher, "tasks": tasks}


def lineage(*, inputs: list[Any], outputs: list[Any], job: Mapping[str, Any],
            run: Mapping[str, Any] | None = None) -> Any:
    """An OperatorLineage: the datasets the user declared, the job facet `volcanoJob`, and once the Job is
    known the run facet `volcanoRun` (its uid, phase, restarts, failure)."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    from airflow_volcano.observability.lineage_facets import VolcanoJobFacet, VolcanoRunFacet

    return OperatorLineage(inputs=inputs, outputs=outputs, job_facets={"volcanoJob": VolcanoJobFacet(**job)},
                           run_facets={"volcanoRun": VolcanoRunFacet(**run)} if run else {})


def fill_model_asset_events(outlets: Iterable[Any] | None, context: Any, summary: Mapping[str, Any], *,
                            uid: str | None, say: Callable[..., None]) -> None:
    """Put what a consumer needs (model_asset_extra) in the event of each Asset among the task's `outlets`:
    Airflow emits the events when the task succeeds, and none if it fails after this."""
    assets = [outlet for outlet in outlets or [] if isinstance(outlet, Asset)]
    if not assets:
        return
    ti = context["ti"]
    extra = model_asset_extra(summary, uid=uid, dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                              try_number=getattr(ti, "try_number", None))
    for asset in assets:
        context["outlet_events"][asset].extra.update(extra)
    say("Asset events for %s: model_uri %s, metrics %s", ", ".join(asset.uri for asset in assets),
        extra["model_uri"] or "not reported", extra["metrics"] or "none reported")


def operator_lineage(*, inlets: Iterable[Any] | None, outlets: Iterable[Any] | None, checkpoint_dir: str | None,
                     job: dict | None, operator: str, launcher: str | None,
                     run: Mapping[str, Any] | None) -> Any:
    """An operator's OpenLineage facets: its inlets and outlets (and checkpoint_dir) as datasets, the Job
    and the run, the Job's secrets masked in every facet (lineage events leave the deployment)."""
    from airflow_volcano.observability.masking import JobSecrets

    outputs = [dataset_of(asset) for asset in outlets or [] if isinstance(asset, Asset)]
    if checkpoint_dir:
        outputs.append(dataset_of(f"file://{checkpoint_dir}"))
    redact = JobSecrets.of(job).redact
    return lineage(inputs=[dataset_of(asset) for asset in inlets or [] if isinstance(asset, Asset)],
                   outputs=outputs, run=redact(run),
                   job=redact(job_description(job, operator=operator, launcher=launcher)))
