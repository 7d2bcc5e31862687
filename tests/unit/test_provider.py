"""Provider registration and example DAGs, as Airflow itself sees them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from airflow_volcano.manifest.pod_runtime import without_signal_forwarding

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def airflow_cli(*args: str) -> str:
    env = dict(os.environ, AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"))
    result = subprocess.run([AIRFLOW, *args], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_airflow_providers_list_shows_the_provider():
    out = airflow_cli("providers", "list", "-o", "plain")
    assert "airflow-volcano" in out


def test_provider_info_lists_hook_operator_sensor_trigger_modules():
    from airflow_volcano.get_provider_info import get_provider_info

    info = get_provider_info()
    modules = {m for kind in ("operators", "sensors", "hooks", "triggers") for entry in info[kind]
               for m in entry["python-modules"]}
    assert modules == {"airflow_volcano.operators.job", "airflow_volcano.operators.master_worker",
                       "airflow_volcano.operators.pytorch", "airflow_volcano.operators.deepspeed",
                       "airflow_volcano.sensors.job",
                       "airflow_volcano.hooks.volcano", "airflow_volcano.triggers.job"}
    for module in modules:
        __import__(module)


def test_task_volcano_pytorch_is_registered_and_ships_the_function(capsys):
    """Airflow finds the decorator through the provider's `task-decorators` entry."""
    import datetime

    from airflow.sdk import DAG, task

    with DAG("decorated", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        @task.volcano_pytorch(image="img:1", worker_replicas=1, namespace="ml")
        def train(epochs: int, lr: float = 0.1) -> dict:
            return {"epochs": epochs, "lr": lr}

        train(3, lr=0.5)

    manifests = dag.get_task("train").dry_run()
    script = manifests["configmap"]["data"]["train.py"]
    assert script.startswith("def train(epochs: int, lr: float = 0.1) -> dict:")
    assert "@task" not in script and '{"args": [3], "kwargs": {"lr": 0.5}}' in script
    master = manifests["job"]["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert without_signal_forwarding(master["command"]) == [
        "python", "/opt/airflow-volcano/script/train.py"]


def test_example_dags_import_cleanly():
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # before Airflow 3.2
        from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    expected = {"volcano_pytorch_seed_demo", "volcano_retraining_pipeline", "volcano_external_job_sensor",
                "volcano_train_evaluate_promote", "volcano_taskflow_training", "volcano_retrain", "volcano_evaluate",
                "volcano_promote"}
    assert expected <= set(bag.dag_ids)


def test_operator_module_does_not_import_the_kubernetes_client():
    code = ("import sys; import airflow_volcano.operators.pytorch, airflow_volcano.sensors.job; "
            "print(any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_dry_run_prints_the_manifests_without_a_cluster(capsys):
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    op = VolcanoPyTorchJobOperator(task_id="train", image="img:1", worker_replicas=2,
                                   training_script=str(REPO / "dags" / "scripts" / "pytorch_demo.py"))
    manifests = op.dry_run()
    printed = capsys.readouterr().out
    assert "kind: ConfigMap" in printed and "kind: Job" in printed
    assert manifests["job"]["spec"]["tasks"][1]["replicas"] == 2


def test_operator_reports_a_missing_script_before_submitting():
    import pytest

    from airflow_volcano.exceptions import JobSpecError
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    op = VolcanoPyTorchJobOperator(task_id="train", image="img:1", training_script="/nope/train.py",
                                   allowed_file_dirs=["/nope"])
    with pytest.raises(JobSpecError, match="training_script: cannot read '/nope/train.py'"):
        op.dry_run()


def test_operator_refuses_log_tasks_the_job_does_not_have_before_submitting():
    import pytest

    from airflow_volcano.exceptions import JobSpecError
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    for log_tasks, expected in ((["workers"], "log_tasks: the job has no task 'workers' (tasks: master, worker)"),
                                ("worker", "log_tasks must be a list of Volcano task names, got 'worker'")):
        op = VolcanoPyTorchJobOperator(task_id="train", image="img:1", log_tasks=log_tasks)
        with pytest.raises(JobSpecError) as error:
            op.dry_run()
        assert expected in str(error.value)
    op = VolcanoPyTorchJobOperator(task_id="train", image="img:1", worker_replicas=2, log_tasks=["master", "worker"])
    manifests = op.build_manifests()
    job = manifests.job
    workers = [f"{job['metadata']['name']}-worker-{i}" for i in range(2)]
    assert [pod for pod, _ in op._log_pods(job, manifests.main_task)] == workers, "the master's is get_logs'"


def test_airflow_links_the_documentation_url_from_the_package_metadata():
    """What the UI's provider list and /api/v2/providers show as the provider's documentation."""
    out = subprocess.run([sys.executable, "-c", "from airflow.providers_manager import ProvidersManager; "
                          "print(ProvidersManager().providers['airflow-volcano'].data['documentation-url'])"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("/airflow-volcano#readme")


def test_operator_passes_launcher_and_restart_arguments_to_the_manifest():
    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    op = VolcanoPyTorchJobOperator(task_id="train", image="img:1", retryable_exit_codes=[137], restart_scope="task",
                                   training_script=str(REPO / "dags" / "scripts" / "pytorch_demo.py"),
                                   launcher="torchrun", nproc_per_node=4, max_restarts=2)
    job = op.build_manifests().job
    assert job["spec"]["policies"][0] == {"exitCode": 137, "action": "RestartTask"}
    command = without_signal_forwarding(job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"])
    assert command[:2] == ["torchrun", "--nproc_per_node=4"] and "--max_restarts=2" in command
