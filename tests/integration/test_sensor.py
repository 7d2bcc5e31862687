"""VolcanoJobSensor on real Jobs submitted outside Airflow."""

from __future__ import annotations

from airflow_volcano.sensors.job import VolcanoJobSensor

from .jobs import pytorch_job


def test_sensor_succeeds_on_completed_job_and_attaches_master_log(cluster, operator_kubeconfig, run_task):
    cluster.write_log("outside-master-0", ["epoch 1 loss 0.5", "epoch 2 loss 0.25"])
    cluster.create_job(pytorch_job("outside", master_sim={"run-for": "1.5s"}))

    run = run_task(lambda: VolcanoJobSensor(task_id="wait", job_name="outside", namespace=cluster.namespace,
                                            poke_interval=1, timeout=120, get_logs=True))

    assert run.state == "success", run.log
    assert "epoch 2 loss 0.25" in run.log
    assert run.xcom["return_value"]["phase"] == "Completed"
    assert cluster.job("outside") is not None, "the sensor must not delete a Job it did not submit"


def test_sensor_fails_with_the_failed_pod_and_exit_code(cluster, operator_kubeconfig, run_task):
    cluster.create_job(pytorch_job("outside-bad", worker_sim={"outcome": "fail", "exit-code": "3", "run-for": "0.5s"},
                                   master_sim={"outcome": "run-forever"}))

    run = run_task(lambda: VolcanoJobSensor(task_id="wait", job_name="outside-bad", namespace=cluster.namespace,
                                            poke_interval=1, timeout=120, mode="reschedule"))

    assert run.state == "failed", run.log
    assert "outside-bad-worker-0" in run.log
    assert "exit code 3" in run.log


def test_sensor_waits_for_a_job_that_does_not_exist_yet(cluster, operator_kubeconfig, run_task):
    run = run_task(lambda: VolcanoJobSensor(task_id="wait", job_name="never-submitted", namespace=cluster.namespace,
                                            poke_interval=1, timeout=3))

    assert run.state == "failed", run.log
    assert "does not exist (yet)" in run.log


def test_the_deferred_sensor_does_not_succeed_on_a_job_that_cannot_pull_its_image(cluster, operator_kubeconfig,
                                                                                 run_task):
    """The trigger reports the image pull back-off at once (the sensor waits with no startup_timeout):
    the task fails saying so, and the Job, not the sensor's, is left alone."""
    cluster.create_job(pytorch_job("nopull", master_sim={"outcome": "image-pull-error"},
                                   worker_sim={"outcome": "image-pull-error"}))

    run = run_task(lambda: VolcanoJobSensor(task_id="wait", job_name="nopull", namespace=cluster.namespace,
                                            poke_interval=1, timeout=120, deferrable=True))

    assert run.state == "failed", run.log
    assert f"Volcano Job {cluster.namespace}/nopull cannot start" in run.log and "ImagePullBackOff" in run.log
    assert cluster.job("nopull") is not None
