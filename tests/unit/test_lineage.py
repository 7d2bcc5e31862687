"""What a training hands its consumers: the model asset's event `extra` and the OpenLineage facets."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG, Asset

from airflow_volcano.exceptions import JobSpecError
from airflow_volcano.observability.lineage import dataset_of, image_digest, model_asset_extra, reported_model
from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

SECRET = "hf_l1neage_0123456789abcdef"


def test_the_termination_messages_model_uri_and_numbers_are_the_model_and_its_metrics():
    uri, metrics = reported_model({"model_uri": "s3://models/r/7", "eval_loss": 0.03, "epochs": 30, "ok": True,
                                   "note": "fine", "metrics": {"auc": 0.94, "label": "x"}})
    assert uri == "s3://models/r/7"
    assert metrics == {"eval_loss": 0.03, "epochs": 30, "auc": 0.94}  # a boolean or a text is no metric
    assert reported_model("a plain text message") == (None, {})
    assert reported_model(None) == (None, {})
    assert reported_model({"loss": 1.5}) == (None, {"loss": 1.5})


def test_the_asset_events_extra_says_which_model_which_job_image_and_run_and_holds_no_environment():
    summary = {"namespace": "ml", "job_name": "ranker-abc", "phase": "Completed", "retry_count": 1,
               "resumed_from": 3, "goodput": {"goodput": 0.8}, "image": "registry/train:1.2",
               "image_digest": "sha256:" + "a" * 64, "master_pod": "ranker-abc-master-0",
               "result": {"model_uri": "s3://m/1", "eval_loss": 0.02}}
    extra = model_asset_extra(summary, uid="uid-1", dag_id="retrain", run_id="scheduled__1", task_id="train",
                              try_number=2)
    assert extra == {
        "model_uri": "s3://m/1", "metrics": {"eval_loss": 0.02},
        "volcano_job": {"namespace": "ml", "name": "ranker-abc", "uid": "uid-1", "phase": "Completed", "restarts": 1},
        "image": "registry/train:1.2", "image_digest": "sha256:" + "a" * 64,
        "airflow": {"dag_id": "retrain", "run_id": "scheduled__1", "task_id": "train", "try_number": 2},
        "resumed_from": 3, "goodput": {"goodput": 0.8},
    }
    json.dumps(extra)  # Airflow stores it as JSON


@pytest.mark.parametrize(("image_id", "digest"), [
    ("docker.io/library/python@sha256:" + "b" * 64, "sha256:" + "b" * 64),  # pulled from a registry
    ("sha256:" + "c" * 64, "sha256:" + "c" * 64),  # built on the node
    ("", None),  # not reported (a container that never started)
])
def test_the_image_digest_is_the_one_the_kubelet_reports(image_id, digest):
    pod = {"status": {"containerStatuses": [
        {"name": "sidecar", "image": "other:1", "imageID": "sha256:" + "d" * 64},
        {"name": "master", "image": "train:1", "imageID": image_id}]}}
    assert image_digest(pod, "master") == ("train:1", digest)
    assert image_digest(pod, "absent") == (None, None)
    assert image_digest(None, "master") == (None, None)


def training(tmp_path, **kwargs: Any) -> VolcanoPyTorchJobOperator:
    (tmp_path / "train.py").write_text("print('train')\n")
    with DAG("lineage", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        dag.fileloc = str(tmp_path / "dag.py")
        return VolcanoPyTorchJobOperator(task_id="train", namespace="ml", image="registry/train:1.2",
                                         training_script="train.py", worker_replicas=2, **kwargs)


def test_model_asset_joins_the_outlets_and_takes_a_uri(tmp_path):
    report = Asset("s3://reports/ranker")
    task = training(tmp_path, model_asset="s3://models/ranker", outlets=[report])
    assert task.model_asset == Asset("s3://models/ranker")
    assert task.outlets == [report, Asset("s3://models/ranker")]


@pytest.mark.parametrize(("value", "said"), [
    (42, "model_asset must be an Asset or its URI (a string), got 42"),
    ("   ", "model_asset must be an Asset or its URI (a string), got '   '"),
    ("airflow://models/x", "model_asset 'airflow://models/x' is not a valid asset URI"),
])
def test_a_bad_model_asset_is_refused_naming_it(tmp_path, value, said):
    with pytest.raises(JobSpecError, match=said.replace("(", r"\(").replace(")", r"\)")):
        training(tmp_path, model_asset=value)


@pytest.mark.openlineage
def test_an_asset_uri_is_an_openlineage_dataset_of_its_authority_and_path():
    assert (dataset_of(Asset("s3://models/ranker")).namespace, dataset_of("s3://models/ranker").name) == (
        "s3://models", "/ranker")
    assert (dataset_of("file:///ckpt/run").namespace, dataset_of("file:///ckpt/run").name) == ("file://", "/ckpt/run")
    assert (dataset_of("postgres://db:5432/features").namespace, dataset_of("postgres://db:5432/features").name) == (
        "postgres://db:5432", "/features")


def serialized(lineage: Any) -> str:
    from openlineage.client.serde import Serde

    return json.dumps({"inputs": [Serde.to_dict(d) for d in lineage.inputs],
                       "outputs": [Serde.to_dict(d) for d in lineage.outputs],
                       "job": {k: Serde.to_dict(v) for k, v in lineage.job_facets.items()},
                       "run": {k: Serde.to_dict(v) for k, v in lineage.run_facets.items()}})


@pytest.mark.openlineage
def test_openlineage_facets_describe_the_job_the_datasets_and_the_run_and_hold_no_secret(tmp_path):
    task = training(tmp_path, model_asset=Asset("s3://models/ranker"), inlets=[Asset("s3://datasets/clicks")],
                    checkpoint_dir="/ckpt", volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
                    volume_mounts=[{"name": "ckpt", "mountPath": "/ckpt"}], env={"HF_TOKEN": SECRET},
                    args=["--token", SECRET],
                    volcano_queue="research", container_resources={"cpu": "2", "nvidia.com/gpu": "1"})
    task.render_template_fields({"params": {}, "run_id": "manual"})

    start = task.get_openlineage_facets_on_start()
    assert [(d.namespace, d.name) for d in start.inputs] == [("s3://datasets", "/clicks")]
    assert [(d.namespace, d.name) for d in start.outputs] == [("s3://models", "/ranker"), ("file://", "/ckpt")]
    job = start.job_facets["volcanoJob"]
    assert (job.namespace, job.queue, job.operator, job.launcher) == (
        "ml", "research", "VolcanoPyTorchJobOperator", None)
    assert job.tasks["master"]["replicas"] == 1 and job.tasks["worker"]["replicas"] == 2
    assert job.tasks["worker"]["image"] == "registry/train:1.2"
    assert job.tasks["worker"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert start.run_facets == {}
    assert SECRET not in serialized(start)

    task._lineage_run = {"uid": "u-1", "namespace": "ml", "name": job.name, "phase": "Failed", "restarts": 2,
                         "failure": "Volcano Job ml/x Failed: pod x-worker-1 exited 1"}
    failed = task.get_openlineage_facets_on_failure(None)
    run = failed.run_facets["volcanoRun"]
    assert (run.uid, run.phase, run.restarts) == ("u-1", "Failed", 2) and run.failure.startswith("Volcano Job ml/x")
    text = serialized(failed)
    assert SECRET not in text and '"_schemaURL": "https://github.com/airflow-volcano' in text


@pytest.mark.openlineage
def test_the_deepspeed_facet_names_its_launcher(tmp_path):
    (tmp_path / "train.py").write_text("print('train')\n")
    with DAG("lineage_ds", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        dag.fileloc = str(tmp_path / "dag.py")
        task = VolcanoDeepSpeedJobOperator(task_id="train", namespace="ml", image="ds:1", training_script="train.py",
                                           worker_replicas=2)
    task.render_template_fields({"params": {}, "run_id": "manual"})
    job = task.get_openlineage_facets_on_complete(None).job_facets["volcanoJob"]
    assert (job.operator, job.launcher) == ("VolcanoDeepSpeedJobOperator", "deepspeed")


@pytest.mark.openlineage
def test_the_facets_schema_documents_every_field_of_the_facets():
    import attr

    from airflow_volcano.observability.lineage_facets import SCHEMA, VolcanoJobFacet, VolcanoRunFacet

    schema = json.loads((Path(__file__).resolve().parents[2] / "docs" / "openlineage-facets.json").read_text())
    assert SCHEMA == schema["$id"] + "#/$defs/"
    for facet in (VolcanoJobFacet, VolcanoRunFacet):
        documented = schema["$defs"][facet.__name__]["allOf"][1]["properties"]
        assert set(documented) == {f.name for f in attr.fields(facet) if not f.name.startswith("_")}


@pytest.mark.parametrize(("eval_loss", "promoted"), [(0.01, True), (0.05, True), (0.2, False)])
def test_the_example_promotes_only_a_model_whose_evaluation_is_good_enough(eval_loss, promoted):
    """dags/volcano_model_pipeline.py's gate, on an evaluation event as the scheduler hands it over (the
    chain itself runs in test_compose_services.py, where the model is good)."""
    import importlib.util
    from types import SimpleNamespace

    path = Path(__file__).resolve().parents[2] / "dags" / "volcano_model_pipeline.py"
    spec = importlib.util.spec_from_file_location("volcano_model_pipeline", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    gate = example.promote_dag.get_task("good_enough").python_callable
    event = SimpleNamespace(extra={"model_uri": "s3://models/linear/1", "eval_loss": eval_loss})

    class TriggeringAssetEvents:
        """Each asset's events, looked up by the asset, as Airflow hands them over (not a dict: Airflow 3.1's
        Asset cannot be hashed)."""

        def __getitem__(self, asset: object) -> list:
            return [event] if asset == example.EVALUATION else []

    assert gate(triggering_asset_events=TriggeringAssetEvents(), params={"max_eval_loss": 0.05}) is promoted
