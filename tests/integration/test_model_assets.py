"""dags/volcano_model_pipeline.py's `volcano_retrain` on the real node, in a worker process of each
Airflow release (dag.test() against a fresh metadata DB): a successful training emits the model asset's
event with its `extra` (the model URI and metrics the master reported, the Volcano Job, the image and
its digest, the run); a failed one emits nothing. On the suite's Airflow the OpenLineage provider's
listener records the run's events with its file transport: the Volcano facets, and no secret.

The real scheduler chaining retrain -> evaluate -> promote is test_compose_services.py's.
"""

from __future__ import annotations

import datetime
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from . import warm_worker
from .airflow_db import migrate
from .conftest import REPO
from .real_node import SMALL
from .test_triggerer import AIRFLOWS, airflow_env

MODEL_URI = "s3://models/linear"
ARTIFACTS = REPO / ".artifacts"  # what was recorded, for a reader (docs/pipelines.md "Retraining pipelines")
SECRET = "hf_m0del_asset_0123456789"

WRAPPER = '''\
"""Written by tests/integration/test_model_assets.py: the example's retrain DAG on the real node."""
import importlib.util, json

spec = importlib.util.spec_from_file_location("volcano_model_pipeline", {example!r})
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
dag = example.dag
train = dag.get_task("train")
placement = json.loads({placement!r})
train.image, train.image_pull_policy = placement["image"], placement["image_pull_policy"]
train.node_selector, train.tolerations = placement["node_selector"], placement["tolerations"]
train.container_resources = json.loads({resources!r})
train.namespace, train.name = {namespace!r}, {name!r}
train.env = {{"HF_TOKEN": {secret!r}}}
train.args = json.loads({args!r})
'''

EVENTS = '''\
import json
from sqlalchemy import select
from airflow.models.asset import AssetEvent, AssetModel
from airflow.utils.session import create_session

with create_session() as session:
    rows = session.execute(select(AssetEvent, AssetModel.uri).join(AssetModel, AssetEvent.asset_id == AssetModel.id))
    print("ASSET-EVENTS " + json.dumps([{"uri": uri, "extra": event.extra, "source_dag_id": event.source_dag_id,
                                         "source_run_id": event.source_run_id} for event, uri in rows]))
'''


def run_retrain(python: Path, env: dict[str, str], dags: Path, cluster: Any, real_node: dict, name: str,
                args: list[str]) -> tuple[int, str]:
    dag_file = dags / f"{name}.py"
    dag_file.write_text(WRAPPER.format(
        example=str(REPO / "dags" / "volcano_model_pipeline.py"), placement=json.dumps(real_node),
        resources=json.dumps(SMALL), namespace=cluster.namespace, name=name, secret=SECRET, args=json.dumps(args)))
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    log = dags / f"{name}.log"
    worker = warm_worker.start([str(dag_file), "volcano_retrain", logical_date], env, log, python=python)
    try:
        code = worker.wait(timeout=420)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    return code, log.read_text()


def asset_events(python: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run([str(python), "-c", EVENTS], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.split("ASSET-EVENTS ", 1)[1])


def airflow_with_lineage(airflow: str, tmp_path: Path) -> tuple[Path, Path, dict[str, str], Path]:
    """An Airflow home of that release, its database migrated (its home, DAG folder, environment), whose
    OpenLineage events go to the file it returns (the suite's venv has the provider: pyproject's test
    group; the oldest release's has none)."""
    python = AIRFLOWS[airflow]
    assert python.exists(), f"{python} is missing: `make venv` builds it"
    home, dags = tmp_path / "airflow-home", tmp_path / "dags"
    dags.mkdir()
    env = airflow_env(home, dags)
    lineage_file = tmp_path / "openlineage.jsonl"
    if airflow == "suite-airflow":
        env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps(
            {"type": "file", "log_file_path": str(lineage_file), "append": True})
        env["AIRFLOW__OPENLINEAGE__NAMESPACE"] = "airflow-volcano-tests"
    migrate(python, env)
    return home, dags, env, lineage_file


# One release after the other, on one test worker: each starts its own metadata DB and worker.
@pytest.mark.xdist_group("model-assets")
@pytest.mark.parametrize("airflow", ["suite-airflow", "lowest"])
def test_a_successful_retrain_emits_its_model_event_with_the_extra_a_consumer_reads_and_a_failed_one_nothing(
        cluster, operator_kubeconfig, real_node, tmp_path, airflow):
    python = AIRFLOWS[airflow]
    home, dags, env, lineage_file = airflow_with_lineage(airflow, tmp_path)

    code, log = run_retrain(python, env, dags, cluster, real_node, "retrain-ok",
                            ["--epochs", "10", "--model-uri", "s3://models/linear/2026-11-26"])
    assert code == 0, log[-6000:]
    (event,) = asset_events(python, env)
    extra = event["extra"]
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"model-asset-event-{airflow}.json").write_text(json.dumps(event, indent=2))
    assert (event["uri"], event["source_dag_id"]) == (MODEL_URI, "volcano_retrain"), event
    # What the master wrote to /dev/termination-log, and what made the model.
    assert extra["model_uri"] == "s3://models/linear/2026-11-26", extra
    assert 0 <= extra["metrics"]["eval_loss"] < 1.0 and extra["metrics"]["world_size"] == 3, extra
    job = extra["volcano_job"]
    assert (job["namespace"], job["name"], job["phase"], job["restarts"]) == (
        cluster.namespace, "retrain-ok", "Completed", 0), job
    assert re.fullmatch(r"[0-9a-f-]{36}", job["uid"]), job
    assert extra["image"] and extra["image"].split(":")[0] in real_node["image"], extra
    assert extra["image_digest"].startswith("sha256:") and len(extra["image_digest"]) == 71, extra
    assert extra["airflow"] == {"dag_id": "volcano_retrain", "run_id": event["source_run_id"], "task_id": "train",
                                "try_number": 1}, extra
    assert extra["goodput"]["wall_seconds"] > extra["goodput"]["running_seconds"] > 0, extra
    assert SECRET not in json.dumps(extra)

    code, log = run_retrain(python, env, dags, cluster, real_node, "retrain-bad", ["--epochs", "not-a-number"])
    assert code != 0 and "argument --epochs: invalid int value" in log, log[-6000:]
    assert len(asset_events(python, env)) == 1, "a failed training emitted an asset event"

    if airflow == "suite-airflow":
        check_openlineage_events(lineage_file, cluster.namespace, job["uid"])


def check_openlineage_events(path: Path, namespace: str, uid: str) -> None:
    """The OpenLineage provider's listener ran our facet methods: START and COMPLETE of the good run, START
    and FAIL of the bad one, with the Volcano facets and the declared output, and no secret anywhere."""
    text = path.read_text()
    (ARTIFACTS / "openlineage-events.jsonl").write_text(text)
    assert SECRET not in text
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    train = [e for e in events if e["job"]["name"] == "volcano_retrain.train"]
    by_type = {e["eventType"]: e for e in train if "volcanoJob" in e["job"].get("facets", {})}
    assert set(by_type) >= {"START", "COMPLETE", "FAIL"}, [(e["eventType"], list(e["job"].get("facets", {})))
                                                           for e in train]
    complete = by_type["COMPLETE"]
    facet = complete["job"]["facets"]["volcanoJob"]
    assert (facet["namespace"], facet["name"], facet["queue"], facet["operator"]) == (
        namespace, "retrain-ok", "default", "VolcanoPyTorchJobOperator"), facet
    assert facet["tasks"]["worker"]["replicas"] == 2 and facet["tasks"]["master"]["image"], facet
    assert facet["_schemaURL"].endswith("#/$defs/VolcanoJobFacet"), facet
    run = complete["run"]["facets"]["volcanoRun"]
    assert (run["uid"], run["phase"], run["restarts"]) == (uid, "Completed", 0), run
    assert [(o["namespace"], o["name"]) for o in complete["outputs"]] == [("s3://models", "/linear")], complete
    failed = by_type["FAIL"]["run"]["facets"]["volcanoRun"]
    assert failed["phase"] in ("Terminated", "Failed") and "retrain-bad" in failed["failure"], failed
