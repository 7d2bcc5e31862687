"""`dry_run()` prints the manifests whole (issue 44): what it prints is what the cluster's own schema
and Volcano's admission webhook accept in a server-side dry run (`kubectl apply --dry-run=server`), the
launch shell inlined, secret values still masked."""

from __future__ import annotations

import datetime
import subprocess

import yaml

from .conftest import VOLCANO


def test_what_dry_run_prints_is_accepted_by_the_clusters_schema_and_webhook(cluster, kubeconfig, tmp_path, capsys):
    from airflow.sdk import DAG

    from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator

    (tmp_path / "train.py").write_text("print('training')\n")
    with DAG("dry_run_whole", schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
        dag.fileloc = str(tmp_path / "dag.py")
        task = VolcanoPyTorchJobOperator(task_id="train", namespace=cluster.namespace, image="img:1",
                                         worker_replicas=1, training_script="train.py",
                                         env={"HF_TOKEN": "hf_dry_run_secret_value"}, launcher="torchrun")
    returned = task.dry_run()
    printed = capsys.readouterr().out
    text = printed[printed.index("apiVersion: v1\nkind: ConfigMap"):]  # after any log line of the build
    documents = list(yaml.safe_load_all(text))
    assert [document["kind"] for document in documents] == ["ConfigMap", "Job"]
    assert documents == [returned["configmap"], returned["job"]], "what it prints is what it returns"
    assert "hf_dry_run_secret_value" not in printed, "secret values stay masked"
    built = task.build_manifests()
    for printed_task, built_task in zip(returned["job"]["spec"]["tasks"], built.job["spec"]["tasks"], strict=True):
        container = printed_task["template"]["spec"]["containers"][0]
        assert container["command"] == built_task["template"]["spec"]["containers"][0]["command"], \
            "the launch shell whole, as submitted"
        assert not any(part.startswith("<") and part.endswith(">") for part in container["command"]), container
    # kubectl apply --dry-run=server: the apiserver's schema and Volcano's webhooks judge it, nothing is kept.
    (tmp_path / "printed.yaml").write_text(text)
    applied = subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "apply", "--dry-run=server", "-f",
                              str(tmp_path / "printed.yaml")], capture_output=True, text=True, timeout=60)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "(server dry run)" in applied.stdout, applied.stdout
    job_name = returned["job"]["metadata"]["name"]
    assert f"job.batch.volcano.sh/{job_name} created (server dry run)" in applied.stdout, applied.stdout
    assert cluster.custom.list_namespaced_custom_object(*VOLCANO, cluster.namespace, "jobs")["items"] == []
