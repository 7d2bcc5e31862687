"""A secret Variable rendered into a Job's `args` (issue 42), with a real worker, a real `airflow triggerer`
and real containers on the real node: the training prints it and reports it in its termination message.
Every place a user reads shows `***` instead: the trigger's copy of the master's log in the task log (the
triggerer never read the Variable), the panel's data, the return XCom, the model asset's event extra, the
recorded panel, the failure report of a task that printed it before failing and that report's OpenLineage
event. It is in clear neither in the trigger's arguments as stored in the metadata DB nor as the REST API
returns them.

The worker is dag.test() leaving the trigger to the triggerer (dag_runner.py --external-triggerer); the
Variable is created in the test's metadata DB, read by the worker only. The worker's own console output is
not checked: dag.test() runs the task in its process, whose console logging masks with airflow-core's
masker, while the Task SDK registers Variables with its own (a deployed worker's supervisor masks with
the SDK's).
"""

from __future__ import annotations

import datetime
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from . import warm_worker
from .real_node import SMALL
from .test_clock_skew import stop
from .test_model_assets import airflow_with_lineage, asset_events
from .test_triggerer import AIRFLOWS, task_instance, trigger_log
from .test_triggerer import in_an_airflow_lane as in_an_airflow_lane  # a fixture

SECRET = "hf_v4riable_9f8e7d6c5b4a"  # the Variable `api_token`: "token" in its name makes it secret to Airflow
DAG_ID = "masked_variable"

TRAIN = """
    import json, os, sys, time
    token = sys.argv[sys.argv.index("--token") + 1]
    print(f"using token {token}", flush=True)
    while not os.path.exists("/tmp/go"):  # the test says when (it reads the panel and the trigger meanwhile)
        time.sleep(0.5)
    with open("/dev/termination-log", "w") as out:
        json.dump({"model_uri": f"hf://models/ranker?token={token}", "eval_loss": 0.25, "argv": sys.argv[1:]}, out)
"""

FAILS = """
    import sys
    token = sys.argv[sys.argv.index("--token") + 1]
    print(f"connecting with {token}", flush=True)
    raise SystemExit(f"refused: {token}")
"""

DAG = """
import datetime
from airflow.sdk import DAG
from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

common = {common!r}
with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
    VolcanoPyTorchJobOperator(task_id="train", name="mvar", training_script="train.py", deferrable=True,
                              model_asset="s3://models/masked", **common)
    VolcanoPyTorchJobOperator(task_id="fails", name="mvarfail", training_script="fails.py", deferrable=False,
                              **common)
"""

# What the metadata DB holds: the trigger rows' stored arguments, the XComs, the DAG run's id.
TRIGGERS = """
import json
from sqlalchemy import text
from airflow.utils.session import create_session

with create_session() as session:
    rows = session.execute(text("SELECT classpath, kwargs FROM trigger")).all()
print("TRIGGERS " + json.dumps([[classpath, kwargs] for classpath, kwargs in rows]))
"""

XCOMS = """
import json, sys
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

with create_session() as session:
    rows = session.query(XComModel).filter_by(dag_id=sys.argv[1]).all()
    print("XCOMS " + json.dumps({f"{row.task_id}/{row.key}": XComModel.deserialize_value(row) for row in rows},
                                default=str))
"""

# The panel's JSON, as its endpoint computes it (the same function), in a process of its own that never
# read the Variable (as the API server).
PANEL = """
import asyncio, json, sys
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from airflow_volcano.panel.app import Cache
from airflow_volcano.panel.data import panel_data

with create_session() as session:
    (run_id,) = [run.run_id for run in session.query(DagRun).filter_by(dag_id=sys.argv[1])]
data = asyncio.run(panel_data(sys.argv[1], run_id, sys.argv[2], -1, None, jobs=Cache(), logs=Cache()))
print("PANEL " + json.dumps(data, default=str))
"""


def python_output(python: Path, env: dict[str, str], program: str, marker: str, *args: str) -> Any:
    out = subprocess.run([str(python), "-c", program, *args], env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(out.stdout.split(f"{marker} ", 1)[1].splitlines()[0])


def everything_under(folder: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in sorted(folder.rglob("*")) if path.is_file())


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.parametrize("airflow", ["suite-airflow", "lowest"])
def test_a_secret_variable_in_args_is_masked_everywhere_a_user_reads_and_never_in_the_trigger_arguments(
        in_an_airflow_lane, cluster, operator_kubeconfig, kubeconfig, real_node, tmp_path, airflow):
    python = AIRFLOWS[airflow]
    home, dags, env, lineage_file = airflow_with_lineage(airflow, tmp_path)
    subprocess.run([str(python), "-m", "airflow", "variables", "set", "api_token", SECRET], env=env, check=True,
                   capture_output=True, timeout=120)

    (dags / "train.py").write_text(textwrap.dedent(TRAIN))
    (dags / "fails.py").write_text(textwrap.dedent(FAILS))
    common = dict(namespace=cluster.namespace, worker_replicas=0, args=["--token", "{{ var.value.api_token }}"],
                  container_resources=SMALL, startup_timeout=120, job_timeout=300, poll_interval=1, **real_node)
    dag_file = dags / f"{DAG_ID}.py"
    dag_file.write_text(DAG.format(common=common, dag_id=DAG_ID))
    worker_log, triggerer_log = tmp_path / "worker.log", tmp_path / "triggerer.log"
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    worker = warm_worker.start([str(dag_file), DAG_ID, logical_date, "--external-triggerer"], env, worker_log,
                               python=python)
    triggerer = subprocess.Popen([str(python), "-m", "airflow", "triggerer"], env=env,
                                 stdout=triggerer_log.open("ab"), stderr=subprocess.STDOUT)
    wrong: list[str] = []  # every place that shows the secret, or lacks the mask: all reported at once

    def check(where: str, text: str, masked: str | None = None) -> None:
        if SECRET in text:
            wrong.append(f"{where}: the secret in clear")
        if masked is not None and masked not in text:
            wrong.append(f"{where}: no {masked!r}")

    try:
        cluster.wait_for("the trigger to copy the master's line", lambda: "[mvar-master-0] using token" in
                         trigger_log(home), timeout=240)
        check("the trigger's copy in the task log", trigger_log(home), "[mvar-master-0] using token ***")

        # While the task is deferred: its trigger's arguments as stored, and as the REST API returns them.
        deferred = task_instance(python, env, DAG_ID)
        assert '"state":"deferred"' in deferred, deferred
        if airflow == "lowest":  # Airflow 3.1 returns the trigger's arguments: what is checked
            assert '"kwargs":"{' in deferred and "kubernetes_conn_id" in deferred, deferred
        check("the REST API's task instance", deferred)
        stored = python_output(python, env, TRIGGERS, "TRIGGERS")
        assert [classpath for classpath, _ in stored] == ["airflow_volcano.triggers.job.VolcanoJobTrigger"], stored
        # Stored as plain JSON, not encrypted with the Fernet key: anything put there would be readable.
        assert '"kubernetes_conn_id": "kubernetes_default"' in json.dumps(json.loads(stored[0][1])), stored
        check("the trigger's arguments in the metadata DB", json.dumps(stored))
        # The panel while the Job runs: read from the cluster, in a process that never read the Variable.
        live = python_output(python, env, PANEL, "PANEL", DAG_ID, "train")
        assert live["source"] == "cluster" and live["log"]["pod"] == "mvar-master-0", live
        check("the live panel's log tail", json.dumps(live["log"]), "using token ***")

        subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "exec", "-n", cluster.namespace, "mvar-master-0",
                        "-c", "master", "--", "touch", "/tmp/go"], check=True, capture_output=True, timeout=60)
        assert worker.wait(timeout=300) == 1, worker_log.read_text()[-5000:]  # `fails` failed, `train` succeeded
    finally:
        stop(worker, triggerer)

    xcoms = python_output(python, env, XCOMS, "XCOMS", DAG_ID)
    result = xcoms["train/return_value"]["result"]
    check("the return XCom's result", json.dumps(result), "hf://models/ranker?token=***")
    assert result["eval_loss"] == 0.25 and result["argv"][0] == "--token", result
    check("the recorded panel of train", json.dumps(xcoms["train/volcano_panel"]), "using token ***")
    check("the recorded panel of fails", json.dumps(xcoms["fails/volcano_panel"]), "connecting with ***")
    (event,) = asset_events(python, env)
    assert event["uri"] == "s3://models/masked", event
    check("the asset event's extra", json.dumps(event["extra"]))
    if event["extra"]["model_uri"] != "hf://models/ranker?token=***":
        wrong.append(f"the asset event's model_uri is {event['extra']['model_uri']!r}")
    check("the triggerer's output", triggerer_log.read_text(errors="replace"))
    check("the log files", everything_under(home / "logs"))
    if airflow == "suite-airflow":
        lineage = lineage_file.read_text()
        failed = [json.loads(line) for line in lineage.splitlines()
                  if '"FAIL"' in line and "masked_variable.fails" in line]
        assert failed and "volcanoRun" in failed[0]["run"]["facets"], lineage[-3000:]
        check("the OpenLineage events", lineage)
        check("the failure's OpenLineage event", json.dumps(failed[0]["run"]["facets"]), "connecting with ***")
    assert not wrong, "\n".join(wrong)
