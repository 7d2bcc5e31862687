"""The "Volcano Job" panel on a task instance's page, in a real `airflow api-server` with the provider
installed (its plugin registered through the provider's info, nothing copied), seen in a real Chromium
(Playwright), on Airflow 3.3 and 3.1: a Job waiting in a full queue (kwok), a training running on the
real node with its progress and a preemption kept on its Job, a failed cascade on the real node (the
first failure marked), a finished Job the task deleted (what the task recorded). Also: no answer and no
cluster request for a viewer who is not signed in or may not read the DAG (counted at a proxy in front of
the apiserver), 50 viewers at once costing what one costs, no secret in any answer. And issue 42's: only
the task's own Job, its log lines only to whom may read task logs, whatever XCom says. Screenshots go to
.artifacts/.
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
import yaml
from kubernetes import client, utils

from airflow_volcano.constants import PREEMPTIONS_ANNOTATION, TASK_INSTANCE_ANNOTATION
from airflow_volcano.ownership.orphans import TaskInstanceId
from airflow_volcano.panel.app import CACHE_SECONDS
from airflow_volcano.panel.plugin import PREFIX
from airflow_volcano.waiting.preemption import Preemption, record

from ..compose_stack import CHROMIUM, CHROMIUM_ARGS, ensure_debian_packages, free_port, wait_until
from . import warm_worker
from .airflow_db import migrate
from .conftest import HTTP, REPO, VOLCANO, Cluster, service_account_token
from .faults import FaultyProxy, upstream_of
from .jobs import pytorch_job
from .panel_auth import NO_LOGS, OUTSIDER, TEAM, USERS
from .real_node import SMALL
from .test_kill_and_reattach import WORKER_WAIT
from .test_queues import GPU, ClusterObjects, filler
from .test_real_failures import CASCADE
from .test_triggerer import AIRFLOWS
from .test_triggerer import in_an_airflow_lane as in_an_airflow_lane  # a fixture

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
        response = HTTP.post(f"{self.url}/auth/token", json={"username": user, "password": passwords[user]},
                             timeout=30)
        response.raise_for_status()
        return response.json()["access_token"]

    def panel_json(self, dag_id: str, run_id: str, task_id: str, token: str | None,
                   pod: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return HTTP.get(f"{self.url}{PREFIX}/api/ti/{dag_id}/{quote(run_id, safe='')}/{task_id}/-1",
                        headers=headers, params={"pod": pod} if pod else None, timeout=60)

    def set_xcoms(self, dag_id: str, run_id: str, task_id: str, token: str, **values: str) -> None:
        """Rewrite the task's XComs through Airflow's REST API (PATCH), as any user who may edit them can.
        Airflow 3.1's PATCH stores a value JSON-encoded twice (a string reads back quoted, so it cannot
        write a plain one): a value that does not read back as given is then written as 3.3's PATCH writes
        it (XComModel.set), in this Airflow's metadata DB."""
        for key, value in values.items():
            response = HTTP.patch(f"{self.url}/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/"
                                  f"taskInstances/{task_id}/xcomEntries/{key}", json={"value": value, "map_index": -1},
                                  headers={"Authorization": f"Bearer {token}"}, timeout=30)
            assert response.status_code == 200, response.text
        written = subprocess.run([str(self.python), "-c", AS_PATCHED, dag_id, run_id, task_id, json.dumps(values)],
                                 env=self.env, capture_output=True, text=True, timeout=120)
        assert written.returncode == 0, written.stdout[-3000:] + written.stderr[-3000:]


# Each XCom read as the panel reads it; one that is not the value given, written as given.
AS_PATCHED = """
import json, sys
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
dag_id, run_id, task_id, values = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
for key, value in values.items():
    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag_id, run_id=run_id, task_id=task_id, key=key,
                                                 map_index=-1).one()
        stored = XComModel.deserialize_value(row)
    if stored != value:
        XComModel.set(key, value, dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=-1)
"""


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
        migrate(python, env, timeout=600)
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
        return HTTP.get(f"{url}/api/v2/monitor/health", timeout=5).status_code == 200
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


def worker(server: ApiServer, path: Path, dag_id: str, log: Path) -> tuple[warm_worker.WarmProcess, str]:
    """dag.test() of the DAG in a process of the Airflow under test, against the api-server's DB; the
    run's id (its logical date)."""
    logical_date = datetime.datetime.now(datetime.UTC).isoformat()
    env = dict(server.env, AIRFLOW_CONN_KUBERNETES_DEFAULT=os.environ["AIRFLOW_CONN_KUBERNETES_DEFAULT"],
               AIRFLOW__CORE__DAGS_FOLDER=str(path.parent))
    process = warm_worker.start([str(path), dag_id, logical_date], env, log, python=server.python)
    return process, f"manual__{logical_date}"


def run_id_of(server: ApiServer, dag_id: str) -> str:
    token = server.token("admin")
    response = HTTP.get(f"{server.url}/api/v2/dags/{dag_id}/dagRuns", headers={"Authorization": f"Bearer {token}"},
                        timeout=30)
    response.raise_for_status()
    (run,) = response.json()["dag_runs"]
    return run["dag_run_id"]


def open_panel(page, server: ApiServer, dag_id: str, run_id: str, task_id: str, *texts: str, shot: str) -> str:
    """The task instance's page, its "Volcano Job" tab: wait for each text inside the panel, keep a
    screenshot (also of a panel that never showed one: `failed-` before its name), return what the
    panel says."""
    from playwright.sync_api import expect

    page.goto(f"{server.url}/dags/{dag_id}/runs/{quote(run_id, safe='')}/tasks/{task_id}/plugin/volcano-job")
    frame = page.frame_locator("iframe")
    ARTIFACTS.mkdir(exist_ok=True)
    try:
        for text in texts:
            expect(frame.get_by_text(text).first).to_be_visible(timeout=120_000)
    except AssertionError:
        page.screenshot(path=str(ARTIFACTS / f"failed-{shot}"), full_page=True)
        raise
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    return frame.locator("body").inner_text()


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.parametrize("api_server", PANEL_AIRFLOWS, indirect=True)
def test_the_volcano_job_panel_shows_a_waiting_a_running_a_failed_and_a_deleted_job(
        in_an_airflow_lane, cluster, api_server, real_node, tmp_path):
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
            keep_a_preemption(cluster, "ptrain")
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


PREEMPTOR = "ml-urgent/retrain-now"


def keep_a_preemption(cluster: Cluster, name: str) -> None:
    """Keep a preemption on the running Job as its waiter keeps those it counted (the preemptions
    annotation; test_preemption.py has Volcano's scheduler preempt a Job and its waiter keep it): the
    panel shows what is kept, with the preemptor's name to a viewer who may read the task's logs."""
    preemption = Preemption(at=time.time() - 5, action="gangpreempt", pods=(f"{name}-master-0",), queue="default",
                            preemptor=PREEMPTOR, preemptor_priority="PriorityClass urgent, priority 1000")
    cluster.custom.patch_namespaced_custom_object(
        *VOLCANO, cluster.namespace, "jobs", name,
        {"metadata": {"annotations": {PREEMPTIONS_ANNOTATION: record([preemption])}}})


def browse(server: ApiServer, release: str) -> list[str]:
    """Each Job's panel in Chromium, as the admin sees it after signing in through the UI's form."""
    from playwright.sync_api import sync_playwright

    texts = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = sign_in(browser, server, "admin")
            waiting = open_panel(page, server, "panel_waiting", run_id_of(server, "panel_waiting"), "waits",
                                 "Why it waits", "position 1 of 1", shot=f"panel-{release}-waiting.png")
            assert "needs 2 nvidia.com/gpu" in waiting and "Pending" in waiting, waiting
            running = open_panel(page, server, "panel_running", run_id_of(server, "panel_running"), "trains",
                                 "Progress", "steps/s, ETA", "ptrain-master-0", shot=f"panel-{release}-running.png")
            assert "Running" in running and "Where the time went" in running, running
            assert "Preemptions (1)" in running and (
                f"by {PREEMPTOR} (PriorityClass urgent, priority 1000) in queue `default`: Volcano's scheduler "
                "(gangpreempt) evicted ptrain-master-0") in running, running
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


# -- issue 42: only the task's own Job, to whom may read it --------------------------------------------------

THEIRS_SECRET = "ANOTHER-TEAMS-SECRET-LINE"
STEPS = 120  # the lines the task's main pod printed: the panel shows the last LOG_TAIL_LINES of them


@pytest.fixture
def their_namespace(admin, cluster, tmp_path) -> Iterator[Cluster]:
    """Another team's namespace (its own ServiceAccount with deploy/rbac.yaml's Role), deleted after the test."""
    namespace = f"{cluster.namespace}-b"
    core = client.CoreV1Api(admin)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    try:
        utils.create_from_yaml(admin, str(REPO / "deploy" / "rbac.yaml"), namespace=namespace)
        (tmp_path / "their-pod-logs").mkdir()
        yield Cluster(admin, namespace, tmp_path / "their-pod-logs")
    finally:
        core.delete_namespace(namespace)


def their_kubeconfig(admin_kubeconfig: Path, theirs: Cluster, path: Path) -> Path:
    """A kubeconfig of their namespace's ServiceAccount: a connection that can read their pods."""
    server = yaml.safe_load(admin_kubeconfig.read_text())["clusters"][0]["cluster"]
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": "sa", "user": {"token": service_account_token(theirs.core, theirs.namespace)}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa", "namespace": theirs.namespace}}],
    }))
    return path


def of_task(body: dict, dag_id: str, task_id: str = "train") -> dict:
    """A Job as the provider marks one of a task instance (its task-instance annotation)."""
    body["metadata"].setdefault("annotations", {})[TASK_INSTANCE_ANNOTATION] = TaskInstanceId(
        dag_id, task_id, "manual__2026-01-01T00:00:00+00:00").annotation("keep_job")
    return body


def forever(name: str, queue: str | None = None) -> dict:
    """A kwok Job whose pods run until the namespace goes; in `queue`, one GPU a pod (it waits there)."""
    body = pytorch_job(name, master_sim={"outcome": "run-forever"}, worker_sim={"outcome": "run-forever"})
    if queue is not None:
        body["spec"]["queue"] = queue
        for task in body["spec"]["tasks"]:
            task["template"]["spec"]["containers"][0]["resources"] = {"requests": {GPU: "1"}, "limits": {GPU: "1"}}
    return body


@pytest.mark.xdist_group("airflow-releases")
@pytest.mark.parametrize("release", PANEL_AIRFLOWS)
def test_the_panel_shows_only_the_tasks_own_job_and_its_logs_only_to_whom_may_read_them(
        in_an_airflow_lane, cluster, their_namespace, operator_kubeconfig, kubeconfig, tmp_path, release):
    """Issue 42. As `nologs` (may read task instances, not task logs): the panel without a log line, nor the
    name of who preempted the Job (the task log's to say), and no log read at the cluster. As `team` (may
    read and edit only its own DAGs' task instances and XComs): `?pod=` naming another team's pod of the
    namespace, or of theirs, is refused; XComs rewritten through the REST API to their namespace, their
    connection and their Jobs show nothing of theirs and make no request with their connection; the
    waiting report names only the team's own Jobs. Their pods' logs are read zero times (counted at the
    proxies in front of the apiserver). In Chromium: the log box opens on its newest line, and a
    `javascript:` link is never a link."""
    theirs, objects = their_namespace, ClusterObjects(cluster)
    # Their Jobs, each printing a secret: one of another DAG in the task's namespace, one in their namespace.
    for where, name in ((cluster, "theirs"), (theirs, "far")):
        where.write_log(f"{name}-master-0", [f"{THEIRS_SECRET} of {name}"])
        where.create_job(of_task(forever(name), "panel_theirs"))
    # A queue full of a filler, where Jobs wait ahead of the task's: one of its own DAG and namespace, one of
    # another DAG, one of its DAG in their namespace.
    queue = objects.queue("p42", {GPU: "2"})
    filler(cluster, queue)
    ahead = ((cluster, "mate", "panel_mine_waits"), (cluster, "rival", "panel_theirs"),
             (theirs, "remote", "panel_mine_waits"))
    for where, name, dag_id in ahead:
        where.create_job(of_task(forever(name, queue), dag_id, "other"))
    for where, name, _ in ahead:
        where.wait_phase(name, {"Pending"})
    cluster.write_log("pmine-master-0", [f"training step {step}/{STEPS} loss 0.{step:03d}" for step in
                                         range(1, STEPS + 1)])
    upstream, ca = upstream_of(operator_kubeconfig), kubeconfig.parent / "pki" / "ca.crt"
    try:
        with FaultyProxy(upstream, ca, every=0) as elsewhere:
            their_connection = proxied_connection(
                elsewhere, their_kubeconfig(kubeconfig, theirs, tmp_path / "their-kubeconfig.json"), theirs.namespace,
                tmp_path / "their-proxied-kubeconfig.json")
            with serve(release, cluster, operator_kubeconfig, kubeconfig, tmp_path,
                       their_cluster=their_connection) as server:
                mine = dag_file(server, "panel_mine", {"trains": dict(
                    namespace=cluster.namespace, name="pmine", image="img:1", worker_replicas=1,
                    annotations={SIM + "outcome": "run-forever"}, poll_interval=1, startup_timeout=120)})
                waits = dag_file(server, "panel_mine_waits", {"waits": dict(
                    namespace=cluster.namespace, name="pwaits", image="img:1", worker_replicas=1,
                    volcano_queue=queue, container_resources={"gpu": 1, "cpu": "1"}, poll_interval=1,
                    startup_timeout=600)})
                workers = [worker(server, mine, "panel_mine", tmp_path / "mine.log")[0],
                           worker(server, waits, "panel_mine_waits", tmp_path / "waits.log")[0]]
                try:
                    cluster.wait_for("the task's Job to run", lambda: cluster.log_shows(
                        "pmine-master-0", f"training step {STEPS}/{STEPS}"), timeout=WORKER_WAIT)
                    cluster.wait_for("the waiting task's Job", lambda: cluster.job("pwaits") is not None,
                                     timeout=WORKER_WAIT)
                    runs = {"mine": run_id_of(server, "panel_mine"), "waits": run_id_of(server, "panel_mine_waits")}
                    keep_a_preemption(cluster, "pmine")
                    answers = [*without_log_rights(server, runs["mine"], cluster.namespace),
                               *other_teams_pods_and_xcoms(server, runs["mine"], cluster, theirs, elsewhere),
                               *naming_in_the_waiting_report(server, runs["waits"], cluster, theirs)]
                    for where, pod in ((cluster, "theirs-master-0"), (theirs, "far-master-0")):
                        assert server.proxy.log_reads_of(where.namespace, pod) == 0, f"{pod}'s log was read"
                        assert elsewhere.log_reads_of(where.namespace, pod) == 0, f"{pod}'s log was read"
                    assert elsewhere.forwarded == 0, "the API server used a connection an XCom named"
                    answers += browse_log_and_links(server, release, runs["mine"])
                    for text in answers:
                        assert THEIRS_SECRET not in text, text
                finally:
                    for process in workers:
                        process.kill()
                        process.wait()
    finally:
        for job in theirs.jobs():  # their Job in the queue: it closes (ClusterObjects.remove) once no Job is left
            theirs.custom.delete_namespaced_custom_object(*VOLCANO, theirs.namespace, "jobs", job["metadata"]["name"])
        objects.remove()


def without_log_rights(server: ApiServer, run_id: str, namespace: str) -> list[str]:
    """`nologs` gets the Job and its pods, no log line (and why), no preemptor's name, and makes the API server
    read no log."""
    token, before = server.token(NO_LOGS), sum(server.proxy.log_reads.values())
    answers = []
    for pod in (None, "pmine-master-0"):
        answer = server.panel_json("panel_mine", run_id, "trains", token, pod=pod)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["job"]["namespace"] == namespace and body["job"]["name"] == "pmine", body
        assert {row["name"] for row in body["pods"]} == {"pmine-master-0", "pmine-worker-0"}, body["pods"]
        assert body["log"] is None and body["progress"] is None, body["log"]
        assert "You may not read this task's logs" in body["log_denied"]
        assert "training step" not in answer.text
        (preemption,) = body["preemptions"]  # who preempted is the task log's to say
        assert PREEMPTOR not in answer.text and "its name is in the task log" in preemption["text"], preemption
        answers.append(answer.text)
    assert sum(server.proxy.log_reads.values()) == before, "a viewer who may not read task logs caused a log read"
    return answers


def other_teams_pods_and_xcoms(server: ApiServer, run_id: str, cluster: Cluster, theirs: Cluster,
                               elsewhere: FaultyProxy) -> list[str]:
    """`team` asks its task's panel for their pods, then rewrites its task's XComs (REST API) to their
    namespace, connection and Jobs: it sees its own Job or a refusal, never theirs."""
    token = server.token(TEAM)
    assert server.panel_json("panel_theirs", "manual__x", "train", token).status_code == 403
    own = server.panel_json("panel_mine", run_id, "trains", token)
    assert own.status_code == 200 and own.json()["log"]["lines"][-1] == f"training step {STEPS}/{STEPS} loss 0.120"
    answers = [own.text]
    for pod in ("theirs-master-0", "far-master-0", "pmine-master-0x"):
        refused = server.panel_json("panel_mine", run_id, "trains", token, pod=pod)
        assert refused.status_code == 404, refused.text
        assert refused.json()["detail"] == (f"Pod {pod!r} is not a pod of this task's Volcano Job "
                                            f"{cluster.namespace}/pmine: its log is not shown")
        answers.append(refused.text)

    def rewrite(**values: str) -> None:
        server.set_xcoms("panel_mine", run_id, "trains", token, **values)

    # Their namespace and connection: ignored (the task rendered its own); its own Job is shown.
    rewrite(namespace=theirs.namespace, kubernetes_conn_id="their_cluster")
    ignored = server.panel_json("panel_mine", run_id, "trains", token)
    assert ignored.status_code == 200 and ignored.json()["job"]["namespace"] == cluster.namespace, ignored.text
    # And their Job's name: there is no such Job where the task runs its Jobs.
    rewrite(job_name="far", main_pod="far-master-0")
    for pod in (None, "far-master-0"):
        far = server.panel_json("panel_mine", run_id, "trains", token, pod=pod)
        assert far.status_code == 200 and far.json()["job"] is None, far.text
        assert far.json()["message"] == f"Volcano Job {cluster.namespace}/far no longer exists", far.text
        answers.append(far.text)
    # Another DAG's Job of the task's own namespace: not this task instance's, so nothing of it is read.
    rewrite(namespace=cluster.namespace, kubernetes_conn_id="kubernetes_default", job_name="theirs",
            main_pod="theirs-master-0")
    for pod in (None, "theirs-master-0"):
        foreign = server.panel_json("panel_mine", run_id, "trains", token, pod=pod)
        assert foreign.status_code == 200 and foreign.json()["job"] is None, foreign.text
        assert "cannot show Volcano Job" in foreign.json()["message"] and "not this task instance's" in foreign.text
        answers.append(foreign.text)
    assert elsewhere.forwarded == 0, "the API server called the cluster with the connection an XCom named"
    rewrite(job_name="pmine", main_pod="pmine-master-0")
    return answers


def naming_in_the_waiting_report(server: ApiServer, run_id: str, cluster: Cluster, theirs: Cluster) -> list[str]:
    """The Jobs ahead: the team's own (its namespace and DAG) named, the others counted."""
    answer = server.panel_json("panel_mine_waits", run_id, "waits", server.token(TEAM))
    assert answer.status_code == 200, answer.text
    waiting = answer.json()["waiting"]
    assert "position 4 of 4 among its waiting Jobs" in waiting, waiting
    assert f"ahead: {cluster.namespace}/mate and 2 Jobs of other namespaces or DAGs" in waiting, waiting
    for name in ("rival", "remote", theirs.namespace):
        assert name not in answer.text, waiting
    return [answer.text]


def sign_in(browser, server: ApiServer, user: str):
    """A page of its own, signed in as `user` through the UI's form."""
    passwords = json.loads((server.home / "simple_auth_manager_passwords.json.generated").read_text())
    page = browser.new_context(viewport={"width": 1500, "height": 1300}).new_page()
    page.goto(f"{server.url}/")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(passwords[user])
    page.get_by_role("button", name="Sign in").click()
    # The form's answer redirects to the home page, which may load late on a busy machine: a page opened
    # before that is interrupted by it, or opened without the session (CI, 2026-11-28, both lanes at once).
    page.wait_for_url(f"{server.url}/", wait_until="networkidle", timeout=120_000)
    return page


# Where the newest and the oldest shown line are, seen from the log box (its visible part).
LINES_IN_VIEW = """([newest, oldest]) => {
  const box = document.querySelector("pre.log");
  const text = box.firstChild;
  const bounds = box.getBoundingClientRect();
  const seen = (needle) => {
    const at = text.data.lastIndexOf(needle), range = document.createRange();
    range.setStart(text, at);
    range.setEnd(text, at + needle.length);
    const line = range.getBoundingClientRect();
    return line.top >= bounds.top - 1 && line.bottom <= bounds.bottom + 1;
  };
  return {overflows: box.scrollHeight > box.clientHeight + 20, first: text.data.split("\\n")[0],
          newest: seen(newest), oldest: seen(oldest), top: box.scrollTop};
}"""


def browse_log_and_links(server: ApiServer, release: str, run_id: str) -> list[str]:
    """In Chromium: the log box shows its newest line without scrolling, and keeps it in view at each refresh
    (a viewer who scrolled up stays there); a link that is not http(s) is no link, even if the JSON had it;
    `nologs` reads why there is no log."""
    from playwright.sync_api import sync_playwright

    newest, oldest = f"training step {STEPS}/{STEPS}", "training step 21/"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = sign_in(browser, server, "admin")

            def with_links(route) -> None:  # the page's own check, whatever the JSON says
                answer = route.fetch()
                body = answer.json()
                body["links"] = {"Evil": "javascript:document.title='pwned'", "Data": "data:text/html,x",
                                 "Dashboard": "https://dashboard.example/pmine"}
                route.fulfill(response=answer, json=body)

            page.route(f"**{PREFIX}/api/**", with_links)
            text = open_panel(page, server, "panel_mine", run_id, "trains", newest, "Dashboard",
                              shot=f"panel-{release}-log-newest.png")
            frame = next(frame for frame in page.frames if f"{PREFIX}/ti/" in frame.url)
            frame.locator("pre.log").screenshot(path=str(ARTIFACTS / f"panel-{release}-log-box.png"))
            view = frame.evaluate(LINES_IN_VIEW, [newest, oldest])
            assert view["overflows"] and view["first"].startswith(oldest), view
            assert view["newest"] and not view["oldest"], f"the log box does not open on its newest line: {view}"
            hrefs = frame.locator("a").evaluate_all("(links) => links.map((link) => link.getAttribute('href'))")
            assert hrefs == ["https://dashboard.example/pmine"], hrefs
            assert f"by {PREEMPTOR} (PriorityClass urgent, priority 1000)" in text, text
            time.sleep(CACHE_SECONDS + 1)  # a refresh: still at the bottom
            assert frame.evaluate(LINES_IN_VIEW, [newest, oldest])["newest"]
            frame.evaluate("() => { document.querySelector('pre.log').scrollTop = 0; }")
            time.sleep(CACHE_SECONDS + 1)  # a refresh after the viewer scrolled up: where they were
            after = frame.evaluate(LINES_IN_VIEW, [newest, oldest])
            assert after["oldest"] and not after["newest"], after
            denied = sign_in(browser, server, NO_LOGS)
            refused = open_panel(denied, server, "panel_mine", run_id, "trains", "You may not read this task's logs",
                                 shot=f"panel-{release}-no-logs.png")
            assert "pmine-master-0" in refused and "training step" not in refused, refused
            assert "Preemptions (1)" in refused and "by a higher-priority Job (its name is in the task log)" in \
                refused and PREEMPTOR not in refused, refused
        finally:
            browser.close()
    return [text, refused]
