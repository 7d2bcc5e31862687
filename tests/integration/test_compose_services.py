"""docker-compose.yaml's services as real processes, with no Docker: each Airflow service's `command`
and `environment`, read from the compose file, run from this repository's venv against a private
PostgreSQL from Debian, in the order its `depends_on` gives, each waited for with its own
`healthcheck`. Only what must differ outside containers is mapped: service host names and ports
(free ports on 127.0.0.1), the mounts (the dags folder, the kubeconfig, the logs volume) and
AIRFLOW_HOME. Then a user's path: an example DAG triggered through the REST API with the simple auth
manager's generated password, the training on the local cluster's real node, the deferred wait in
the real triggerer, and the task's page in the Airflow UI in a real Chromium (Playwright), with its
log and the provider's two link buttons; screenshots are kept in .artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..compose_stack import (
    CHROMIUM,
    CHROMIUM_ARGS,
    POLICY,
    Stack,
    compose_stack,
    login,
    signed_in,
    unpause,
    wait_until,
)
from .conftest import REPO
from .test_triggerer import trigger_log

DAG_ID = "volcano_pytorch_seed_demo"
JOB_NAME = "pytorch-job-with-configmap"  # the DAG's fixed Job name; the namespace is the test's own
MASTER_POD = f"{JOB_NAME}-master-0"
SMALL = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "2Gi"}}
LINK_TEMPLATES = {
    "VOLCANO_JOB_URL_TEMPLATE": "https://volcano.example.com/job/{namespace}/{name}",
    "VOLCANO_POD_LOG_URL_TEMPLATE": "https://k8s.example.com/#/log/{namespace}/{pod}/pod?container={container}",
}
SCREENSHOT = REPO / ".artifacts" / "ui-task-page.png"
SCREENSHOT_DETAILS = REPO / ".artifacts" / "ui-task-details.png"

@pytest.fixture(scope="module")
def stack(kubeconfig: Path, real_node: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The compose services, shared by this file's tests (one xdist group, so one worker starts them once)."""
    home = tmp_path_factory.mktemp("compose") / "airflow-home"
    policy = POLICY.format(placement=json.dumps(real_node), resources=json.dumps(SMALL))
    with compose_stack(kubeconfig, home, policy=policy, variables=LINK_TEMPLATES) as started:
        yield started


@pytest.fixture
def namespace(kubeconfig: Path) -> Iterator[str]:
    name = f"compose-{os.urandom(4).hex()}"
    kubectl = ["kubectl", f"--kubeconfig={kubeconfig}"]
    subprocess.run([*kubectl, "create", "namespace", name], check=True, capture_output=True)
    yield name
    subprocess.run([*kubectl, "delete", "namespace", name, "--wait=false"], capture_output=True)


@pytest.mark.xdist_group("compose")
def test_the_compose_services_run_an_example_dag_and_the_ui_shows_its_log_and_links(stack, namespace):
    username, password = login(stack)
    with signed_in(stack, username, password) as http:
        unpause(http, DAG_ID)
        response = http.post(f"/api/v2/dags/{DAG_ID}/dagRuns", json={"logical_date": None,
                                                                     "conf": {"namespace": namespace}})
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]

        run = wait_until("the DAG run to finish", lambda: (
            r := http.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}").json())["state"] in ("success", "failed")
            and r, timeout=420, interval=2)
        ti_url = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/train"
        ti = http.get(ti_url).json()
        log = json.dumps(http.get(f"{ti_url}/logs/{ti['try_number']}", params={"full_content": True},
                                  headers={"Accept": "application/json"}).json(), ensure_ascii=False)
        assert run["state"] == "success", f"task log:\n{stack.secrets.redact(log)[-6000:]}\n{stack.logs()}"

        # Deferred: the scheduler's task submitted the Job and handed the wait to the triggerer.
        assert f"Deferring: the triggerer waits for Volcano Job {namespace}/{JOB_NAME}" in log, log[-6000:]
        assert f"Waiting for Volcano Job {namespace}/{JOB_NAME}" in trigger_log(stack.host.home) + log
        assert f"[{MASTER_POD}] Epoch [5/5], Average Loss:" in log, log[-6000:]

        links = http.get(f"{ti_url}/links").json()["extra_links"]
        assert links["Volcano dashboard"] == f"https://volcano.example.com/job/{namespace}/{JOB_NAME}", links
        assert links["Master pod log"].startswith(f"https://k8s.example.com/#/log/{namespace}/{MASTER_POD}/"), links

    log_page, details_page = open_the_task_in_the_ui(stack, username, password,
                                                     f"/dags/{DAG_ID}/runs/{run_id}/tasks/train", namespace)
    print(f"\nscreenshots of the task's page: {SCREENSHOT} (log), {SCREENSHOT_DETAILS} (links)")
    # The task log as the UI shows it: the operator's lines, the trigger's, the master's losses.
    assert f"Deferring: the triggerer waits for Volcano Job {namespace}/{JOB_NAME}" in log_page, log_page[-3000:]
    assert f"Volcano Job {namespace}/{JOB_NAME} is Running: 3/3 pods running" in log_page, log_page[-3000:]
    assert f"[{MASTER_POD}] Epoch [5/5], Average Loss:" in log_page, log_page[-3000:]
    assert "Extra Links" in details_page, details_page[-3000:]


def open_the_task_in_the_ui(stack: Stack, username: str, password: str, path: str,
                            namespace: str) -> tuple[str, str]:
    """Log in through the UI's own form, open the task's page (its log, the default tab), then its
    Details tab (where Airflow 3 puts extra links); keep a full-page screenshot of each and return
    each page's text."""
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOT.parent.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1200})
            page.goto(stack.api + path)
            page.get_by_label("Username").fill(username)
            page.get_by_label("Password").fill(password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"**{path}")
            expect(page.get_by_text(f"[{MASTER_POD}] Epoch [5/5], Average Loss:")).to_be_visible(timeout=60_000)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            log_page = page.inner_text("body")

            page.get_by_role("link", name="Details", exact=True).click()
            page.wait_for_url(f"**{path}/details")
            expect(page.get_by_role("link", name="Volcano dashboard")).to_have_attribute(
                "href", f"https://volcano.example.com/job/{namespace}/{JOB_NAME}")
            expect(page.get_by_role("link", name="Master pod log")).to_have_attribute(
                "href", f"https://k8s.example.com/#/log/{namespace}/{MASTER_POD}/pod?container=master")
            page.screenshot(path=str(SCREENSHOT_DETAILS), full_page=True)
            return log_page, page.inner_text("body")
        finally:
            browser.close()


def runs(http: httpx.Client, dag_id: str) -> list[dict[str, Any]]:
    response = http.get(f"/api/v2/dags/{dag_id}/dagRuns")
    assert response.status_code == 200, response.text
    return response.json()["dag_runs"]


def finished_run(http: httpx.Client, dag_id: str, run_id: str | None = None, timeout: float = 420) -> dict[str, Any]:
    """The DAG's run (its only one, or `run_id`) once it has ended."""
    def ended() -> dict[str, Any] | None:
        found = [run for run in runs(http, dag_id) if run_id in (None, run["dag_run_id"])]
        return found[0] if len(found) == 1 and found[0]["state"] in ("success", "failed") else None
    return wait_until(f"a run of {dag_id} to end", ended, timeout=timeout, interval=2)


def returned(http: httpx.Client, dag_id: str, run_id: str, task_id: str) -> Any:
    response = http.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")
    assert response.status_code == 200, response.text
    return response.json()["value"]


PIPELINE = ("volcano_retrain", "volcano_evaluate", "volcano_promote")


@pytest.mark.xdist_group("compose")
def test_the_scheduler_chains_retrain_evaluate_and_promote_through_model_assets_and_a_failed_retrain_starts_nothing(
        stack, namespace):
    """dags/volcano_model_pipeline.py in the compose services: a manual run of `volcano_retrain` trains on
    the real node; its model asset event makes the scheduler run `volcano_evaluate`, which reads the
    event's `extra`; the evaluation's event runs `volcano_promote`, which promotes the good model."""
    username, password = login(stack)
    with signed_in(stack, username, password) as http:
        for dag_id in PIPELINE:
            unpause(http, dag_id)
        response = http.post("/api/v2/dags/volcano_retrain/dagRuns",
                             json={"logical_date": None, "conf": {"namespace": namespace, "epochs": 30}})
        assert response.status_code == 200, response.text
        retrain = finished_run(http, "volcano_retrain", response.json()["dag_run_id"])
        assert retrain["state"] == "success", stack.logs()

        (event,) = [e for e in http.get("/api/v2/assets/events").json()["asset_events"]
                    if e["source_dag_id"] == "volcano_retrain"]
        assert (event["uri"], event["source_run_id"]) == ("s3://models/linear", retrain["dag_run_id"]), event
        model_uri = event["extra"]["model_uri"]
        assert re.fullmatch(r"s3://models/linear/\d{8}T\d{6}", model_uri), event
        assert event["extra"]["volcano_job"]["namespace"] == namespace, event

        evaluate = finished_run(http, "volcano_evaluate", timeout=180)
        assert (evaluate["state"], evaluate["run_type"]) == ("success", "asset_triggered"), evaluate
        evaluation = returned(http, "volcano_evaluate", evaluate["dag_run_id"], "evaluate")
        assert evaluation["model_uri"] == model_uri, evaluation
        assert evaluation["eval_loss"] == event["extra"]["metrics"]["eval_loss"] < 0.05, evaluation
        assert evaluation["volcano_job_uid"] == event["extra"]["volcano_job"]["uid"], evaluation

        promote = finished_run(http, "volcano_promote", timeout=180)
        assert (promote["state"], promote["run_type"]) == ("success", "asset_triggered"), promote
        assert returned(http, "volcano_promote", promote["dag_run_id"], "promote") == f"promoted {model_uri}"

        # A training that fails emits no model event: nothing downstream runs.
        response = http.post("/api/v2/dags/volcano_retrain/dagRuns",
                             json={"logical_date": None, "conf": {"namespace": namespace, "epochs": "not-a-number"}})
        assert response.status_code == 200, response.text
        failed = finished_run(http, "volcano_retrain", response.json()["dag_run_id"])
        assert failed["state"] == "failed", failed
        time.sleep(15)  # several scheduler loops, in which a new event would have queued a run
        assert len(runs(http, "volcano_evaluate")) == 1, runs(http, "volcano_evaluate")
        events = [e for e in http.get("/api/v2/assets/events").json()["asset_events"]
                  if e["source_dag_id"] == "volcano_retrain"]
        assert len(events) == 1, events
