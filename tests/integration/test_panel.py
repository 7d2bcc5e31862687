"""The "Volcano Job" panel on a task instance's page, in a real `airflow api-server` with the provider
installed (its plugin registered through the provider's info, nothing copied), seen in a real Chromium
(Playwright), on Airflow 3.3 and 3.1: a Job waiting in a full queue (kwok), a training running on the
real node with its progress, a failed cascade on the real node (the first failure marked), a finished
Job the task deleted (what the task recorded). Also: no answer and no cluster request for a viewer who
is not signed in or may not read the DAG (counted at a proxy in front of the apiserver), 50 viewers at
once costing what one costs, no secret in any answer. Screenshots go to .artifacts/.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from airflow_volcano.panel.app import CACHE_SECONDS
from airflow_volcano.panel.plugin import PREFIX

from ..compose_stack import CHROMIUM, CHROMIUM_ARGS, ensure_debian_packages, free_port, wait_until
from .conftest import REPO
from .faults import FaultyProxy, upstream_of
from .panel_auth import OUTSIDER, USERS
from .real_node import SMALL
from .test_kill_and_reattach import RUNNER, WORKER_WAIT
from .test_queues import GPU, ClusterObjects, filler
from .test_real_failures import CASCADE
from .test_triggerer import AIRFLOWS
from .test_triggerer import one_airflow_at_a_time as one_airflow_at_a_time  # a fixture

SIM = "sim.airflow-volcano.io/"
ARTIFACTS = REPO / ".artifacts"
SECRET = "hf_p4nel_0123456789abcdef"  # an env value the scripts print: no answer may hold it
RESUMABLE = REPO / "dags" / "scripts" / "train_resumable.py"
PANEL_AIRFLOWS = ("suite-airflow", "lowest")


@dataclass
class ApiServer:
    url: str
    home: Path
    env: dict[str, str]
    python: Path
    proxy: FaultyProxy

    def token(self, user: str) -> str:
        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        response = httpx.post(f"{self.url}/auth/token", json={"username": user, "password": passwords[user]},
                              timeout=30)
        response.raise_for_status()
        return response.json()["access_token"]

    def panel_json(self, dag_id: str, run_id: str, task_id: str, token: str | None,
                   pod: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{self.url}{PREFIX}/api/ti/{dag_id}/{quote(run_id, safe='')}/{task_id}/-1",
                         headers=headers, params={"pod": pod} if pod else None, timeout=60)

    def set_xcom(self, dag_id: str, run_id: str, task_id: str, key: str, value: object, token: str) -> None:
        """Rewrite one of the task's XComs through Airflow's REST API, as any user who may edit them can."""
        response = httpx.patch(f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
                               f"{task_id}/xcomEntries/{key}", json={"value": value, "map_index": -1},
                               headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert response.status_code == 200, response.text


def airflow_env(home: Path, connection: dict) -> dict[str, str]:
    """The api-server's and the workers' environment: one metadata DB, the test's auth manager."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW")}
    env.update(
        AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__AUTH_MANAGER="tests.integration.panel_auth.OneOutsiderAuthManager",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS=USERS,
        AIRFLOW_CONN_KUBERNETES_DEFAULT=json.dumps(connection), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1",
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
    )
    return env


@pytest.fixture
def api_server(request, cluster, operator_kubeconfig, kubeconfig, tmp_path) -> Iterator[ApiServer]:
    """A metadata DB and `airflow api-server` of the Airflow under test. Its `kubernetes_default` (the
    connection the tasks name) reaches the apiserver through a counting proxy; the workers' goes straight."""
    with serve(request.param, cluster, operator_kubeconfig, kubeconfig, tmp_path) as server:
        yield server


def proxied_connection(proxy: FaultyProxy, kubeconfig: Path, namespace: str, path: Path) -> dict:
    """A `kubernetes` connection whose kubeconfig reaches the apiserver through `proxy`."""
    config = json.loads(kubeconfig.read_text())
    config["clusters"][0]["cluster"] = {"server": proxy.url}
    path.write_text(json.dumps(config))
    return {"conn_type": "kubernetes", "extra": {"kube_config_path": str(path), "namespace": namespace}}


@contextlib.contextmanager
def serve(release: str, cluster, operator_kubeconfig: Path, kubeconfig: Path, tmp_path: Path,
          **connections: dict) -> Iterator[ApiServer]:
    """The api_server fixture's server; `connections`: more connections it knows (AIRFLOW_CONN_<ID>)."""
    ensure_debian_packages()
    python = AIRFLOWS[release]
    assert python.exists(), f"{python} is missing: `make venv` builds it"
    home = tmp_path / "airflow-home"
    (home / "dags").mkdir(parents=True)
    with FaultyProxy(upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt", every=0) as proxy:
        env = airflow_env(home, proxied_connection(proxy, operator_kubeconfig, cluster.namespace,
                                                   tmp_path / "panel-kubeconfig.json"))
        env.update({f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(value) for conn_id, value in connections.items()})
        migrated = subprocess.run([str(python), "-m", "airflow", "db", "migrate"], env=env, capture_output=True,
                                  text=True, timeout=600)
        assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
        port = free_port()
        with (tmp_path / "api-server.log").open("ab") as log:
            process = subprocess.Popen([str(python), "-m", "airflow", "api-server", "--port", str(port)],
                                       env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_until("the api-server to answer", lambda: _answers(url), timeout=WORKER_WAIT,
                       failed=lambda: process.poll() is not None)
            yield ApiServer(url, home, env, python, proxy)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def dag_folder(server: ApiServer, dag_id: str) -> Path:
    """A folder of the DAG's own (its file and scripts): each worker parses only its DAG's folder (two
    filling the metadata DB from one folder at once collide)."""
    folder = server.home / "dags" / dag_id
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def dag_file(server: ApiServer, dag_id: str, tasks: dict[str, dict]) -> Path:
    """A DAG of VolcanoPyTorchJobOperator tasks (in order), in its folder."""
    path = dag_folder(server, dag_id) / f"{dag_id}.py"
    operators = "\n".join(f"    t{index} = VolcanoPyTorchJobOperator(task_id={task_id!r}, **{kwargs!r})"
                          for index, (task_id, kwargs) in enumerate(tasks.items()))
    path.write_text(textwrap.dedent("""
        import datetime
        from airflow.sdk import DAG
        from airflow_volcano.operators.pytorch import VolcanoPyTorchJobOperator
        with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)) as dag:
    """).format(dag_id=dag_id) + operators + "\n")
    return path


def worker(server: ApiServer, path: Path, dag_id: str, log: Path) -> tuple[subprocess.Popen, str]:
    """dag.test() of the DAG in a process of the Airflow under test, against the api-server's DB; the
    run's id (its logical date)."""
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    env = dict(server.env, AIRFLOW_CONN_KUBERNETES_DEFAULT=os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"],
               AIRFLOW__CORE__DAGS_FOLDER=str(path.parent))
    process = subprocess.Popen([str(server.python), str(RUNNER), str(path), dag_id, logical_date], env=env,
                               stdout=log.open("ab"), stderr=subprocess.STDOUT)
    return process, f"manual__{logical_date}"


def run_id_of(server: ApiServer, dag_id: str) -> str:
    token = server.token("admin")
    response = httpx.get(f"{server.url}/api/v2/dags/{dag_id}/dagRuns", headers={"Authorization": f"Bearer {token}"},
                         timeout=30)
    response.raise_for_status()
    (run,) = response.json()["dag_runs"]
    return run["dag_run_id"]


def open_panel(page, server: ApiServer, dag_id: str, run_id: str, task_id: str, *texts: str, shot: str) -> str:
    """The task instance's page, its "Volcano Job" tab: wait for each text inside the panel, keep a
    screenshot, return what the panel says."""
    from playwright.sync_api import expect

    page.goto(f"{server.url}/dags/{dag_id}/runs/{quote(run_id, safe='')}/tasks/{task_id}/plugin/volcano-job")
    frame = page.frame_locator("iframe")
    for text in texts:
        expect(frame.get_by_text(text).first).to_be_visible(timeout=120_000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    return frame.locator("body").inner_text()


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.parametrize("api_server", PANEL_AIRFLOWS, indirect=True)
def test_the_volcano_job_panel_shows_a_waiting_a_running_a_failed_and_a_deleted_job(
        one_airflow_at_a_time, cluster, api_server, real_node, tmp_path):
    server = api_server
    release = "3.3" if server.python == AIRFLOWS["suite-airflow"] else "3.1"
    objects = ClusterObjects(cluster)
    try:
        # What ended: a cascade on the real node, and a kwok Job the task deleted when it succeeded.
        ended = dag_file(server, "panel_ended", {
            "cascade": dict(namespace=cluster.namespace, name="pcasc", worker_replicas=2, container_resources=SMALL,
                            training_script=str(_script(dag_folder(server, "panel_ended"), "cascade.py", CASCADE)),
                            env={"HF_TOKEN": SECRET},
                            startup_timeout=120, poll_interval=1, **real_node),
            "deleted": dict(namespace=cluster.namespace, name="pdone", image="img:1", worker_replicas=1,
                            annotations={SIM + "run-for": "3s"}, poll_interval=1, env={"HF_TOKEN": SECRET}),
        })
        process, _ = worker(server, ended, "panel_ended", tmp_path / "ended.log")
        assert process.wait(timeout=WORKER_WAIT) == 1, (tmp_path / "ended.log").read_text()[-5000:]  # cascade failed
        # What runs: a Job waiting in a full queue (kwok), a training with progress on the real node.
        queue = objects.queue("panel", {GPU: "2"})
        filler(cluster, queue)
        waiting = dag_file(server, "panel_waiting", {"waits": dict(
            namespace=cluster.namespace, name="pwait", image="img:1", worker_replicas=1, volcano_queue=queue,
            container_resources={"gpu": 1, "cpu": "1"}, poll_interval=1, startup_timeout=600,
            env={"HF_TOKEN": SECRET})})
        running = dag_file(server, "panel_running", {"trains": dict(
            namespace=cluster.namespace, name="ptrain", worker_replicas=1, container_resources=SMALL,
            training_script=str(_script(dag_folder(server, "panel_running"), "train_resumable.py",
                                        RESUMABLE.read_text(), verbatim=True)),
            env={"HF_TOKEN": SECRET, "EPOCHS": "8", "STEPS_PER_EPOCH": "10", "EPOCH_SECONDS": "8"},
            startup_timeout=120, poll_interval=1, **real_node)})
        waiter, _ = worker(server, waiting, "panel_waiting", tmp_path / "waiting.log")
        trainer, _ = worker(server, running, "panel_running", tmp_path / "running.log")
        try:
            cluster.wait_for("the training to report progress", lambda: cluster.log_shows(
                "ptrain-master-0", "[airflow-volcano] progress 5/80"), timeout=WORKER_WAIT)
            cluster.wait_for("the waiting Job", lambda: cluster.job("pwait") is not None, timeout=WORKER_WAIT)
            answers = check_access_and_cost(server, run_id_of(server, "panel_waiting"))
            texts = browse(server, release)
            for text in [*answers, *texts]:
                assert SECRET not in text, "a secret in an answer of the panel"
        finally:
            for process in (waiter, trainer):
                process.kill()
                process.wait()
    finally:
        objects.remove()


def _script(folder: Path, name: str, body: str, verbatim: bool = False) -> Path:
    path = folder / name
    path.write_text(body if verbatim else textwrap.dedent(body).replace(
        "import os\n", "import os\nprint('token', os.environ['HF_TOKEN'], flush=True)\n", 1))
    return path


def check_access_and_cost(server: ApiServer, run_id: str) -> list[str]:
    """Nobody signed in: 401; a user who may not read the DAG: 403; neither costs a cluster request.
    An allowed user gets the data; 50 at once cost what one costs (one read per cache period)."""
    before = server.proxy.forwarded
    assert server.panel_json("panel_waiting", run_id, "waits", None).status_code == 401
    assert server.panel_json("panel_waiting", run_id, "waits", server.token(OUTSIDER)).status_code == 403
    assert server.proxy.forwarded == before, "a refused viewer made the API server call the cluster"
    token = server.token("admin")
    one = server.panel_json("panel_waiting", run_id, "waits", token)
    assert one.status_code == 200, one.text
    cost = server.proxy.forwarded - before
    assert cost > 0 and one.json()["job"]["name"] == "pwait"
    time.sleep(CACHE_SECONDS + 1)  # the cache's period is over: the next answer reads the cluster again

    async def fifty() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as http:
            url = f"{server.url}{PREFIX}/api/ti/panel_waiting/{quote(run_id, safe='')}/waits/-1"
            return await asyncio.gather(*(http.get(url, headers={"Authorization": f"Bearer {token}"})
                                          for _ in range(50)))

    before = server.proxy.forwarded
    answers = asyncio.run(fifty())
    assert [answer.status_code for answer in answers] == [200] * 50
    assert server.proxy.forwarded - before <= cost, (
        f"50 viewers cost {server.proxy.forwarded - before} requests, one viewer {cost}")
    return [one.text, *(answer.text for answer in answers)]


def browse(server: ApiServer, release: str) -> list[str]:
    """Each Job's panel in Chromium, as the admin sees it after signing in through the UI's form."""
    from playwright.sync_api import sync_playwright

    passwords = json.loads((server.home / "simple_auth_manager_passwords.json.generated").read_text())
    texts = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            page.goto(f"{server.url}/")
            page.get_by_label("Username").fill("admin")
            page.get_by_label("Password").fill(passwords["admin"])
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_load_state("networkidle")
            waiting = open_panel(page, server, "panel_waiting", run_id_of(server, "panel_waiting"), "waits",
                                 "Why it waits", "position 1 of 1", shot=f"panel-{release}-waiting.png")
            assert "needs 2 nvidia.com/gpu" in waiting and "Pending" in waiting, waiting
            running = open_panel(page, server, "panel_running", run_id_of(server, "panel_running"), "trains",
                                 "Progress", "steps/s, ETA", "ptrain-master-0", shot=f"panel-{release}-running.png")
            assert "Running" in running and "Where the time went" in running, running
            failed = open_panel(page, server, "panel_ended", run_id_of(server, "panel_ended"), "cascade",
                                "(first failure)", "Failure", shot=f"panel-{release}-failed.png")
            assert "pcasc-worker-0 (first failure)" in failed and "ValueError: shard 1 is corrupt" in failed, failed
            deleted = open_panel(page, server, "panel_ended", run_id_of(server, "panel_ended"), "deleted", "Completed",
                                 "as the task recorded it when it ended", shot=f"panel-{release}-deleted.png")
            assert "pdone-master-0" in deleted, deleted
            texts = [waiting, running, failed, deleted]
        finally:
            browser.close()
    return texts
