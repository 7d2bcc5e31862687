"""Secrets stay secret in everything the provider shows and stores: a secret in a DeepSpeed launch's
arguments, a secret a failing pod prints in its last lines (real node, real containers)."""

from __future__ import annotations

import asyncio
import base64
import json

from airflow_volcano.operators.deepspeed import VolcanoDeepSpeedJobOperator

from .real_node import SMALL, real_operator, script

SECRET = "hf_launch_secret_4f7a9c2e81"

USES_THE_TOKEN = """
    import sys
    import deepspeed, torch.distributed as dist
    deepspeed.init_distributed(dist_backend="gloo")
    token = sys.argv[sys.argv.index("--token") + 1]
    print(f"rank {dist.get_rank()} got a token of {len(token)} characters", flush=True)
    dist.barrier()
"""


def forms(secret: str) -> list[str]:
    """The secret, and the encodings a launcher might show it in."""
    raw = secret.encode()
    return [secret, base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("=")]


def test_a_secret_variable_in_deepspeed_args_appears_in_no_form_in_the_task_or_triggerer_log(
        cluster, operator_kubeconfig, run_task, real_node, tmp_path, monkeypatch):
    """DeepSpeed's runner logs its pdsh command line into the master's log, hence the task log; the
    arguments used to travel there base64-encoded, which Airflow's masker does not recognise. Now the
    workers hold them (their own spec), and the command line carries none."""
    monkeypatch.setenv("AIRFLOW_VAR_HF_API_KEY", SECRET)
    run = run_task(lambda: VolcanoDeepSpeedJobOperator(
        task_id="train", name="dstoken", namespace=cluster.namespace, worker_replicas=1,
        training_script=script(tmp_path, USES_THE_TOKEN), args=["--token", "{{ var.value.hf_api_key }}"],
        container_resources=SMALL, startup_timeout=120, job_timeout=300, poll_interval=1, deferrable=True,
        **real_node))

    assert run.state == "success", run.log
    assert f"rank 0 got a token of {len(SECRET)} characters" in run.log, "the rank got it, whole"
    for form in forms(SECRET):
        assert form not in run.log, f"{form!r} in the task log"


LEAKS_ITS_TOKEN = """
    import os, time
    print(f"connecting with {os.environ['HF_TOKEN']}", flush=True)
    time.sleep(1)
    os._exit(1)
"""


def test_a_secret_a_failing_pod_prints_is_masked_in_the_trigger_event_and_the_task_log(
        cluster, operator_kubeconfig, real_node, tmp_path, capfd, monkeypatch):
    """The trigger copies the line a real container prints with the Job's secret env value masked, and its
    event, which Airflow logs and stores as it is, holds no secret. Run as the triggerer runs it, straight
    from its run(). (The failed pods' statuses an event may carry, whose termination message is a failed
    container's last lines, are masked too: tests/unit/test_event_masking.py.)"""
    from airflow_volcano.hooks.volcano import VolcanoHook
    from airflow_volcano.ownership.submission import submit
    from airflow_volcano.triggers.job import VolcanoJobTrigger

    secret = "hf_leaky_token_98765abcd"
    # No DAG here: the script's folder is allowed through the [volcano] setting an administrator uses.
    monkeypatch.setenv("AIRFLOW__VOLCANO__ALLOWED_FILE_DIRS", str(tmp_path))
    operator = real_operator(real_node, cluster.namespace, "leak", worker_replicas=0,
                             training_script=script(tmp_path, LEAKS_ITS_TOKEN), env={"HF_TOKEN": secret})
    manifests = operator.build_manifests()
    ref = submit(VolcanoHook(), manifests, cluster.namespace)
    trigger = VolcanoJobTrigger(ref.to_dict(), "kubernetes_default", log_interval=1)

    async def fired() -> dict:
        return (await anext(trigger.run())).payload

    payload = asyncio.run(asyncio.wait_for(fired(), timeout=240))
    logged = capfd.readouterr()
    assert payload["phase"] == "Terminated", payload  # exit code 1: not retryable, the Job is ended
    assert secret not in json.dumps(payload), "nothing secret in the event Airflow logs and stores"
    assert "[leak-master-0] connecting with ***" in logged.out + logged.err, "the copied line, masked"
    assert secret not in logged.out + logged.err
