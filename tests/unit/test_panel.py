"""The Volcano Job panel's data (pure) and its cache (one read per period, however many viewers)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from airflow_volcano.manifest.retry_budget import apply_retry_budget
from airflow_volcano.observability.goodput import RunTimeline
from airflow_volcano.observability.masking import JobSecrets
from airflow_volcano.panel.app import Cache
from airflow_volcano.panel.view import log_tail, panel, pod_rows, progress_from_log
from airflow_volcano.timestamps import clock_text

from .test_goodput import T0, at, job


def failed(name: str, task: str, code: int, finished: str) -> dict:
    return {"metadata": {"name": name, "labels": {"volcano.sh/task-spec": task}},
            "spec": {"nodeName": "gpu-3"},
            "status": {"phase": "Failed", "containerStatuses": [{"name": task, "restartCount": 0, "state": {
                "terminated": {"exitCode": code, "reason": "Error", "startedAt": at(5), "finishedAt": finished}}}]}}


def test_the_pod_that_failed_first_is_marked_and_each_pod_says_where_and_how_it_ended():
    rows = pod_rows([failed("t-master-0", "master", 1, at(60)), failed("t-worker-0", "worker", 137, at(59))],
                    "master")
    assert [(row["name"], row["first_failure"]) for row in rows] == [("t-master-0", False), ("t-worker-0", True)]
    assert rows[1] | {"first_failure": True} == {
        "name": "t-worker-0", "task": "worker", "phase": "Failed", "node": "gpu-3", "restarts": 0, "exit_code": 137,
        "reason": "Error", "started": T0 + 5, "finished": T0 + 59, "first_failure": True}


def test_a_log_tail_is_escaped_masked_and_without_the_providers_own_lines():
    secrets = JobSecrets()
    secrets.add([("HF_TOKEN", "hf_s3cr3t_value")])
    raw = (f"{at(1)[:-1]}.000000001Z loaded hf_s3cr3t_value\n"
           f"{at(2)[:-1]}.000000001Z [airflow-volcano] heartbeat\n"
           f"{at(3)[:-1]}.000000001Z \x1b[31mred\r\n").encode()
    assert log_tail("p", raw, secrets.redact) == {"pod": "p", "lines": ["loaded ***", "\\x1b[31mred"]}
    # Read after its container went: the kubelet's own answer is no line of the pod's.
    gone = b"unable to retrieve container logs for containerd://eade9b55fff5a21fc67badcd0dd4"
    assert log_tail("p", raw + gone, secrets.redact) == {"pod": "p", "lines": ["loaded ***", "\\x1b[31mred"]}
    assert log_tail("p", gone, secrets.redact) == {"pod": "p", "lines": []}


def test_progress_is_read_from_the_main_pods_recent_lines():
    raw = "".join(f"{at(second)[:-1]}.000000001Z [airflow-volcano] progress {second * 2}/100 steps\n"
                  for second in range(10)).encode()
    progress = progress_from_log(raw)
    assert progress is not None and progress.done == 18 and progress.rate == 2.0
    assert progress_from_log(b"no progress here\n") is None


def test_the_panel_of_a_running_job_counts_its_time_to_now_and_is_json():
    running = job(("Pending", 0), ("Running", 30))
    running["metadata"].update(name="train", namespace="ml", uid="u1")
    shown = panel(job=running, pods=[], main_task="master", now=T0 + 90, timeline=RunTimeline(placed={"0": T0 + 20}),
                  failure="boom hf_s3cr3t_value", redact=lambda text: text.replace("hf_s3cr3t_value", "***"))
    assert shown["job"]["name"] == "train" and shown["job"]["age_seconds"] == 90
    assert [step["phase"] for step in shown["job"]["timeline"]] == ["Pending", "Running"]
    assert shown["goodput"]["wall_seconds"] == 90 and shown["goodput"]["running_seconds"] == 60
    assert shown["failure"] == "boom ***"
    assert shown["job"]["restart_budget"] is None, "no maxRetry: nothing said of a bound"
    json.dumps(shown)
    apply_retry_budget(running, 2)
    assert panel(job=running, pods=[], main_task="master", now=T0 + 90)["job"]["restart_budget"] == \
        "maxRetry 6 for max_retry 3, max_preemptions 2", "the restarts' two bounds, and Volcano's room for both"


def test_fifty_viewers_at_once_cost_one_read_per_period():
    reads = 0

    async def read() -> int:
        nonlocal reads
        reads += 1
        await asyncio.sleep(0.05)
        return reads

    async def viewers() -> list[int]:
        cache = Cache(seconds=60)
        return await asyncio.gather(*(cache.get(("conn", "ml", "train"), read) for _ in range(50)))

    assert asyncio.run(viewers()) == [1] * 50 and reads == 1


def test_the_panels_progress_is_read_from_the_newest_lines_of_a_long_log():
    """Issue 41: the panel computed progress from the log's first 256 KiB, so a long run showed its start.
    The kubelet cuts a tail at limitBytes from the tail's oldest line: a tail that fills it is read again
    shorter, so the newest lines are always read."""
    from airflow_volcano.panel.data import newest_lines
    from airflow_volcano.panel.view import progress_from_log

    lines = [f"2026-11-27T10:{step // 60:02d}:{step % 60:02d}Z {'x' * 200} [airflow-volcano] progress {step}/3000 "
             "steps" for step in range(3000)]

    class Hook:
        asked: list[int] = []

        def run(self, call):
            query = dict(call.kwargs["query_params"])
            tail, limit = int(query["tailLines"]), int(query["limitBytes"])
            self.asked.append(tail)
            return "".join(line + "\n" for line in lines[-tail:]).encode()[:limit]

    hook = Hook()
    progress = progress_from_log(newest_lines(hook, "train-master-0", "ml"))
    assert progress is not None and progress.done == 2999, progress
    assert hook.asked == [2000, 250], "the 2,000-line tail filled 256 KiB: read again, shorter"


# -- issue 42: the panel shows only the task's own Job, to whom may read it ----------------------------------

ML_TI = ("train_dag", "manual__1", "train", -1)  # dag_id, run_id, task_id, map_index (panel_data's order)
MANIFEST = ("apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata:\n  name: train\n  namespace: ml\n"
            "  labels: {app.kubernetes.io/managed-by: airflow-volcano}\nspec:\n  queue: default\n  tasks:\n"
            "  - name: master\n    replicas: 1\n    template: {spec: {containers: [{name: master, image: 'img:1'}]}}\n")
RENDERED = {"kubernetes_conn_id": "kubernetes_default", "job_manifest": MANIFEST, "namespace": "ml"}


def annotated(body: dict, dag_id: str = "train_dag", task_id: str = "train", run_id: str = "manual__1",
              namespace: str = "ml", name: str = "train", uid: str = "uid-train") -> dict:
    from airflow_volcano.constants import TASK_INSTANCE_ANNOTATION
    from airflow_volcano.ownership.orphans import TaskInstanceId

    body["metadata"].update(name=name, namespace=namespace, uid=uid, annotations={
        TASK_INSTANCE_ANNOTATION: TaskInstanceId(dag_id, task_id, run_id, -1).annotation("delete_job")})
    return body


def owned_pod(name: str, owner_uid: str, job_name: str = "train") -> dict:
    return {"metadata": {"name": name, "labels": {"volcano.sh/job-name": job_name, "volcano.sh/task-spec": "master"},
                         "ownerReferences": [{"kind": "Job", "name": job_name, "uid": owner_uid}]},
            "spec": {"nodeName": "gpu-1"}, "status": {"phase": "Running"}}


class World:
    """The cluster as the panel's fake hook sees it, and every read the panel made of it."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[str, list[dict]] = {}
        self.logs: dict[str, bytes] = {}
        self.snapshot = None
        self.conns: list[str] = []
        self.reads: list[tuple[str, ...]] = []

    def hook(self):
        world = self

        class Hook:
            def __init__(self, kubernetes_conn_id: str | None = None, **_: object) -> None:
                world.conns.append(kubernetes_conn_id)

            def get_namespace(self) -> str | None:
                return None

            def get_job(self, name: str, namespace: str) -> dict | None:
                world.reads.append(("job", namespace, name))
                return world.jobs.get((namespace, name))

            def list_job_pods(self, name: str, namespace: str) -> list[dict]:
                world.reads.append(("pods", namespace, name))
                return world.pods.get(name, [])

            def get_podgroup(self, job: dict) -> dict | None:
                return None

            def drive(self, program):
                program.close()
                return world.snapshot

            def run(self, call):
                pod = call.what.rpartition("/")[2]
                world.reads.append(("log", pod))
                return world.logs.get(pod, b"")

        return Hook


def ask(monkeypatch, world: World, *, xcom: dict, rendered: dict | None = RENDERED, state: str = "running",
        pod: str | None = None, may_read_logs: bool = True, deployment: str | None = "prod") -> dict:
    from airflow_volcano.panel import data

    monkeypatch.setattr("airflow_volcano.hooks.volcano.VolcanoHook", world.hook())
    monkeypatch.setattr(data, "task_instance_record",
                        lambda *ti: data.TaskInstanceRecord(state, xcom, rendered, deployment))
    return asyncio.run(data.panel_data(*ML_TI, pod, jobs=Cache(), logs=Cache(), may_read_logs=may_read_logs))


def running_world() -> World:
    world = World()
    world.jobs[("ml", "train")] = annotated(job(("Pending", 0), ("Running", 30)))
    world.pods["train"] = [owned_pod("train-master-0", "uid-train"), owned_pod("train-worker-0", "uid-train")]
    world.logs["train-master-0"] = f"{at(40)[:-1]}.000000001Z [airflow-volcano] progress 5/10 steps\n".encode()
    return world


def test_the_job_is_read_with_the_connection_and_in_the_namespace_the_task_rendered_never_from_xcom(monkeypatch):
    """XComs are user-writable (REST API): one pointing at another connection and namespace changes nothing."""
    world = running_world()
    world.jobs[("theirs", "train")] = annotated(job(("Running", 0)), namespace="theirs")
    shown = ask(monkeypatch, world, xcom={"job_name": "train", "namespace": "theirs",
                                         "kubernetes_conn_id": "their_cluster"})
    assert set(world.conns) == {"kubernetes_default"}
    assert {read[1] for read in world.reads if read[0] != "log"} == {"ml"}
    assert shown["job"]["namespace"] == "ml" and shown["source"] == "cluster"
    assert shown["log"]["pod"] == "train-master-0"


def test_the_namespace_is_the_rendered_manifests_even_when_airflow_cut_it(monkeypatch):
    from airflow_volcano.panel.data import TRUNCATED_PREFIX, Target, rendered_target

    # Cut inside a flow mapping of the spec: the whole text is no YAML, its `metadata` block is.
    cut = TRUNCATED_PREFIX + MANIFEST.replace("namespace: ml", "namespace: from-manifest")[:-30] + "..."
    assert rendered_target({**RENDERED, "job_manifest": cut}) == Target("kubernetes_default", "from-manifest")
    inside = TRUNCATED_PREFIX + MANIFEST[:40] + "..."  # cut inside `metadata`: the rendered `namespace` field
    assert rendered_target({**RENDERED, "job_manifest": inside}) == Target("kubernetes_default", "ml")
    assert "does not say" in rendered_target({**RENDERED, "job_manifest": inside, "namespace": None})
    no_namespace = MANIFEST.replace("  namespace: ml\n", "")  # the connection's namespace, as the operator does
    assert rendered_target({**RENDERED, "job_manifest": no_namespace, "namespace": None}) == Target(
        "kubernetes_default", None)


def test_without_the_tasks_rendered_fields_nothing_is_read_of_the_cluster(monkeypatch):
    world = running_world()
    shown = ask(monkeypatch, world, xcom={"job_name": "train", "namespace": "ml"}, rendered=None)
    assert world.reads == [] and world.conns == []
    assert shown["job"] is None and "keeps no rendered fields" in shown["message"]


def test_a_job_that_names_another_task_instance_is_not_shown_and_nothing_more_of_it_is_read(monkeypatch):
    world = running_world()
    world.jobs[("ml", "theirs")] = annotated(job(("Running", 0)), dag_id="their_dag", name="theirs", uid="u2")
    world.jobs[("ml", "plain")] = job(("Running", 0)) | {"metadata": {"name": "plain", "namespace": "ml"}}
    world.pods["theirs"] = [owned_pod("theirs-master-0", "u2", "theirs")]
    for name in ("theirs", "plain"):
        world.reads.clear()
        shown = ask(monkeypatch, world, xcom={"job_name": name}, pod=f"{name}-master-0")
        assert shown["job"] is None and "it is not this task instance's Job" in shown["message"], shown
        assert world.reads == [("job", "ml", name)], "pods or a log of another task's Job read"


def test_a_pod_the_job_does_not_own_is_refused_and_its_log_never_read(monkeypatch):
    import pytest

    from airflow_volcano.panel.data import NotTheJobsPod

    world = running_world()
    # Wearing the Job's name label is not enough: its owner reference must carry the Job's uid.
    world.pods["train"].append(owned_pod("train-impostor-0", "uid-of-another-job"))
    world.logs["secret-pod"] = b"2026-01-01T10:00:00.000000001Z ANOTHER-TEAMS-SECRET-LINE\n"
    for pod in ("secret-pod", "train-impostor-0"):
        with pytest.raises(NotTheJobsPod, match="is not a pod of this task's Volcano Job ml/train"):
            ask(monkeypatch, world, xcom={"job_name": "train"}, pod=pod)
    assert not [read for read in world.reads if read[0] == "log"], world.reads
    shown = ask(monkeypatch, world, xcom={"job_name": "train"}, pod="train-worker-0")
    assert shown["log"]["pod"] == "train-worker-0"
    assert [pod["name"] for pod in shown["pods"]] == ["train-master-0", "train-worker-0"]


def test_a_viewer_who_may_not_read_task_logs_gets_the_panel_without_one_log_read(monkeypatch):
    world = running_world()
    shown = ask(monkeypatch, world, xcom={"job_name": "train"}, may_read_logs=False)
    assert shown["job"]["name"] == "train" and len(shown["pods"]) == 2
    assert shown["log"] is None and shown["progress"] is None and "may not read this task's logs" in shown["log_denied"]
    assert not [read for read in world.reads if read[0] == "log"], world.reads
    recorded = {"job": {"name": "train"}, "pods": [], "log": {"pod": "train-master-0", "lines": ["secret"]},
                "failure": "Traceback: the last lines", "stacks": ["thread 1"], "progress": {"done": 5}}
    ended = ask(monkeypatch, world, xcom={"job_name": "train", "volcano_panel": recorded}, state="failed",
                may_read_logs=False)
    assert ended["source"] == "recorded" and ended["log"] is None and ended["failure"] is None
    assert ended["stacks"] == [] and ended["progress"] is None and ended["log_denied"]
    # A viewer who may: the lines, and the progress read from the main pod's log.
    allowed = ask(monkeypatch, world, xcom={"job_name": "train"})
    assert allowed["log"]["lines"] == ["[airflow-volcano] progress 5/10 steps"] and allowed["progress"]["done"] == 5


def test_links_are_http_or_https_only_live_and_recorded(monkeypatch):
    from airflow_volcano.panel.data import safe_links

    given = {"ok": "https://dash.example/ml/train", "plain": "http://grafana:3000/x", "js": "javascript:alert(1)",
             "spaced": " JavaScript:alert(1)", "data": "data:text/html,<script>1</script>", "relative": "/admin",
             "no-host": "https:alert(1)", "not-text": ["https://x"]}
    assert safe_links(given) == {"ok": "https://dash.example/ml/train", "plain": "http://grafana:3000/x"}
    world = running_world()
    live = ask(monkeypatch, world, xcom={"job_name": "train", "_link_VolcanoJobLink": "javascript:alert(1)",
                                         "_link_MasterLogLink": "https://logs.example/train"})
    assert live["links"] == {"Master pod log": "https://logs.example/train"}
    recorded = ask(monkeypatch, world, state="success", xcom={"job_name": "train", "volcano_panel": {
        "job": {"name": "train"}, "pods": [], "links": given}})
    assert recorded["links"] == safe_links(given)


def test_the_waiting_report_names_no_job_of_another_namespace_or_dag(monkeypatch):
    """Jobs ahead are named only if they are of the task's namespace and DAG (their task-instance
    annotation, which Volcano copies to the PodGroup); the others are counted."""
    from airflow_volcano.waiting.queueing import QueueSnapshot

    def podgroup(name: str, created: int, namespace: str = "ml", dag_id: str | None = "train_dag") -> dict:
        """The PodGroup of Job `name`, with its Job's annotation (None: a Job no task instance names)."""
        owner = {"name": name, "uid": f"uid-{name}"}
        body = {"metadata": {"creationTimestamp": at(created), "ownerReferences": [owner]},
                "spec": {"queue": "research", "minResources": {"nvidia.com/gpu": "2"}}, "status": {"phase": "Pending"}}
        annotated(body, dag_id=dag_id or "", namespace=namespace, name=f"{name}-pg", uid=f"pg-{name}")
        if dag_id is None:
            del body["metadata"]["annotations"]
        return body

    world = running_world()
    world.jobs[("ml", "train")] = annotated(job(("Pending", 0)))
    world.snapshot = QueueSnapshot("research", {"metadata": {"name": "research"}, "spec": {
        "capability": {"nvidia.com/gpu": "2"}}, "status": {"state": "Open", "allocated": {"nvidia.com/gpu": "2"}}},
        (podgroup("train", 50), podgroup("mate", 1), podgroup("theirs", 2, dag_id="their_dag"),
         podgroup("remote", 3, namespace="other"), podgroup("plain", 4, dag_id=None)))
    shown = ask(monkeypatch, world, xcom={"job_name": "train"})
    text = shown["waiting"]
    assert "position 5 of 5" in text and "ahead: ml/mate and 3 Jobs of other namespaces or DAGs" in text, text
    for name in ("theirs", "remote", "plain", "other/"):
        assert name not in text, text


def deployed(body: dict, deployment: str) -> dict:
    from airflow_volcano.constants import DEPLOYMENT_LABEL

    body["metadata"].setdefault("labels", {})[DEPLOYMENT_LABEL] = deployment
    return body


def test_the_same_task_instances_job_of_another_deployment_is_not_shown(monkeypatch):
    """Staging and prod share the namespace and run the same task instances: prod's panel, its XCom
    pointed at staging's Job (the REST API lets a user rewrite it), shows nothing of it; a Job of an
    earlier release (no deployment label) is still shown."""
    world = running_world()
    world.jobs[("ml", "staged")] = deployed(annotated(job(("Running", 0)), name="staged", uid="u-staged"), "staging")
    world.pods["staged"] = [owned_pod("staged-master-0", "u-staged", "staged")]
    shown = ask(monkeypatch, world, xcom={"job_name": "staged"}, pod="staged-master-0")
    assert shown["job"] is None and "another Airflow deployment" in shown["message"], shown
    assert world.reads == [("job", "ml", "staged")], "pods or a log of another deployment's Job read"
    # A panel that knows no deployment id (none stored: it never submitted) shows no labelled Job either.
    world.reads.clear()
    assert ask(monkeypatch, world, xcom={"job_name": "staged"}, deployment=None)["job"] is None

    deployed(world.jobs[("ml", "train")], "prod")
    assert ask(monkeypatch, world, xcom={"job_name": "train"})["job"]["name"] == "train"
    del world.jobs[("ml", "train")]["metadata"]["labels"]
    assert ask(monkeypatch, world, xcom={"job_name": "train"})["job"]["name"] == "train", "an earlier release's Job"


def test_the_waiting_report_names_no_job_of_another_deployment():
    from airflow_volcano.panel.data import nameable

    def podgroup(deployment: str | None) -> dict:
        body = annotated({"metadata": {}}, name="mate-pg")
        return deployed(body, deployment) if deployment else body

    check = nameable("ml", "train_dag", "prod")
    assert check(podgroup("prod")) and check(podgroup(None))
    assert not check(podgroup("staging"))


# -- issue 45: the panel's account of preemptions ---------------------------------------------------------------

def preempted_job() -> dict:
    """A Job preempted once (kept on it by its waiter: the preemptions annotation), running again since."""
    from airflow_volcano.constants import PREEMPTIONS_ANNOTATION
    from airflow_volcano.waiting.preemption import Preemption, record

    # Volcano v1.15 keeps a phase's latest condition only: the first Running (at 30) is gone.
    body = annotated(job(("Pending", 0), ("Restarting", 60), ("Pending", 62), ("Running", 100)))
    body["metadata"]["annotations"][PREEMPTIONS_ANNOTATION] = record([Preemption(
        at=T0 + 60, action="gangpreempt", pods=("train-master-0", "train-worker-0"), queue="team-a",
        preemptor="ml/urgent-hf_s3cr3t_value", preemptor_priority="PriorityClass high, priority 1000")])
    return body


def test_the_panel_lists_the_preemptions_kept_on_the_job_and_counts_their_time():
    shown = panel(job=preempted_job(), now=T0 + 120, redact=lambda text: text.replace("hf_s3cr3t_value", "***"))
    (row,) = shown["preemptions"]
    assert row["text"] == (f"{clock_text(T0 + 60)} by ml/urgent-*** (PriorityClass high, priority 1000) in queue "
                           "`team-a`: Volcano's scheduler (gangpreempt) evicted train-master-0, train-worker-0")
    assert row["preemptor"] == "ml/urgent-***" and row["at"] == T0 + 60
    # Read from the cluster (no waiter's timeline): eviction to Running again is preempted time.
    assert shown["goodput"]["preempted_seconds"] == 40 and shown["goodput"]["preemptions"] == 1
    assert panel(job=annotated(job(("Pending", 0), ("Running", 30))), now=T0 + 60)["preemptions"] == []
    json.dumps(shown)


def test_a_viewer_who_may_not_read_task_logs_is_not_told_who_preempted_live_or_recorded(monkeypatch):
    world = World()
    world.jobs[("ml", "train")] = preempted_job()
    denied = ask(monkeypatch, world, xcom={"job_name": "train"}, may_read_logs=False)
    (row,) = denied["preemptions"]
    assert "urgent" not in json.dumps(denied["preemptions"]) and "priority 1000" not in row["text"]
    assert row["text"].startswith(f"{clock_text(T0 + 60)} by a higher-priority Job (its name is in the task log) "
                                  "in queue `team-a`")
    allowed = ask(monkeypatch, world, xcom={"job_name": "train"})
    assert "by ml/urgent-hf_s3cr3t_value (PriorityClass high" in allowed["preemptions"][0]["text"]
    recorded = {"job": {"name": "train"}, "pods": [], "preemptions": allowed["preemptions"]}
    ended = ask(monkeypatch, world, xcom={"job_name": "train", "volcano_panel": recorded}, state="success",
                may_read_logs=False)
    assert ended["source"] == "recorded" and "urgent" not in json.dumps(ended["preemptions"])
    assert "a higher-priority Job (its name is in the task log)" in ended["preemptions"][0]["text"]
    # One the task log could not name either: why, as it said.
    unnamed = {**allowed["preemptions"][0], "preemptor": None, "preemptor_priority": None,
               "unknown_why": "none placed since then is visible in namespace ml"}
    ended = ask(monkeypatch, world, xcom={"job_name": "train", "volcano_panel": {**recorded, "preemptions": [unnamed]}},
                state="success", may_read_logs=False)
    assert "by a higher-priority Job (none placed since then is visible in namespace ml)" in \
        ended["preemptions"][0]["text"]


def test_the_panel_the_task_records_has_the_preemptions_its_wait_said_even_one_not_kept_on_the_job():
    """A preemption said as the wait ended (its preemptor looked for until then) is not kept on the Job:
    the record the task makes at its end has it from the wait's outcome."""
    from airflow_volcano.constants import OnFinishAction
    from airflow_volcano.ownership.finalize import finalize
    from airflow_volcano.waiting.events import Verdict, WaitOutcome
    from airflow_volcano.waiting.preemption import Preemption

    from .test_finalize import REF, Hook

    ended = preempted_job()
    ended["status"]["state"] = {"phase": "Completed", "lastTransitionTime": at(130)}
    kept = panel(job=ended)["preemptions"]
    late = Preemption(at=T0 + 110, action="gangpreempt", pods=("train-master-0",), queue="team-a",
                      unknown_why="none placed since then is visible in namespace ml")
    pushed: dict = {}
    outcome = WaitOutcome(Verdict.FINISHED, phase="Completed", job=ended,
                          preemptions=(*(Preemption.from_dict(row) for row in kept), late))
    finalize(Hook(), REF, outcome, on_finish_action=OnFinishAction.KEEP_JOB, push_xcom=pushed.__setitem__)
    rows = pushed["volcano_panel"]["preemptions"]
    assert [row["at"] for row in rows] == [T0 + 60, T0 + 110]
    assert "by a higher-priority Job (none placed since then is visible in namespace ml) in queue `team-a`" in \
        rows[1]["text"]
    # A wait that said none (a sensor's, say): what the waiters kept on the Job.
    finalize(Hook(), REF, dataclasses.replace(outcome, preemptions=()), on_finish_action=OnFinishAction.KEEP_JOB,
             push_xcom=pushed.__setitem__)
    assert [row["at"] for row in pushed["volcano_panel"]["preemptions"]] == [T0 + 60]


def test_a_job_the_api_servers_identity_may_not_read_says_which_permission_and_where_it_is_granted(monkeypatch):
    """Airflow in Kubernetes: the API server reads with its own ServiceAccount, which may read less than the
    task's. The panel says so (not an HTTP 500), and keeps what the task recorded, if it did."""
    from airflow_volcano.exceptions import VolcanoApiError

    world = running_world()

    def refused(name: str, namespace: str) -> dict:
        raise VolcanoApiError(f"get Job {namespace}/{name}", 403, "Forbidden", 'jobs.batch.volcano.sh "train" is '
                              'forbidden: User "system:serviceaccount:airflow:airflow-api-server" cannot get resource')

    hook = world.hook()
    hook.get_job = lambda self, name, namespace: refused(name, namespace)
    monkeypatch.setattr("airflow_volcano.hooks.volcano.VolcanoHook", hook)
    from airflow_volcano.panel import data

    monkeypatch.setattr(data, "task_instance_record",
                        lambda *ti: data.TaskInstanceRecord("running", {"job_name": "train"}, RENDERED, "prod"))
    shown = asyncio.run(data.panel_data(*ML_TI, None, jobs=Cache(), logs=Cache()))
    assert shown["job"] is None
    assert shown["message"] == (
        "The panel cannot read Volcano Job ml/train: get Job ml/train failed: HTTP 403 Forbidden: "
        'jobs.batch.volcano.sh "train" is forbidden: User "system:serviceaccount:airflow:airflow-api-server" cannot '
        "get resource. The API "
        "server reads the Job with the task's connection as its own identity: grant that identity "
        "deploy/rbac-helm-chart.yaml's read-only Role airflow-volcano-panel in the Job's namespace")
